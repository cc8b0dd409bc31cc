"""Stop control: signals, the ranks' agreement to stop, the progress watchdog, and how a rank leaves after an
agreed stop or a failure.

A first SIGINT/SIGTERM asks the job to stop: the ranks agree on it in a tiny collective, write a
final checkpoint and end with 128 + the signal. A second one stops at once (the default action).
The ranks agree often enough that a stop takes at most about CHECK_PERIOD_S of training, or one step
when steps are longer than that: launchers give their workers only seconds after the signal
(horovodrun 5 s, mpirun --mca odls_base_sigkill_timeout, 1 s by default) before killing them.
The watchdog ends a rank whose collective waited longer than --timeout plus a grace period (some waits,
an MPI collective whose peer stopped, have no timeout of their own), or at once when a rank it waits for
is gone; either way it says where every other rank is.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from typing import Callable, List, NoReturn, Optional

from common.errors import print_error
from common.loop.backend import Backend
from .liveness import Liveness, PeerState
from .watchdog import CollectiveWatchdog

#: training seconds between the ranks' checks for a stop request (a tiny collective each time)
CHECK_PERIOD_S = 0.5
#: at most this many steps between two checks (steps of under a millisecond)
MAX_CHECK_EVERY = 1000
#: a SIGTERM this soon after the first is the same request delivered twice (Slurm's scancel reaches every task of
#: slurm/ddp_torchrun.sbatch from its node's slurmstepd and again from torchrun), not a second one
SAME_REQUEST_S = 2.0
#: how much longer than --timeout the watchdog lets a collective wait (the backends' own timeouts go first)
WATCHDOG_GRACE_S = 1.0


class Interrupted(Exception):
    """SIGINT/SIGTERM asked the job to stop; a checkpoint was written at `step`."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(signum, step)
        self.signum, self.step = signum, step


class StopControl:
    """Stop requests from signals, agreed across ranks, and the watchdog that ends a stalled rank."""

    def __init__(self, backend: Backend, timeout_s: float, prog: str) -> None:
        self.backend, self.timeout_s, self.prog = backend, timeout_s, prog
        self.signal: Optional[int] = None
        self._signalled_at = 0.0
        self.watchdog: Optional[CollectiveWatchdog] = None
        self.next_check = 1  # the first check comes after the first step, then at the agreed pace
        self._last_check_step = 0
        self._last_check_time = time.monotonic()
        self.liveness: Optional[Liveness] = None  # this rank's answering port, once the job has formed

    def start_liveness(self) -> None:
        """After the backend's init (and after an elastic job re-formed): open this rank's answering port and learn
        every rank's (a collective). See common.faults.liveness."""
        self.close_liveness()
        backend = self.backend
        self.liveness = Liveness(backend.rank, backend.activity, backend.host(),
                                 single_host=backend.local_world_size == backend.world_size)
        self.liveness.know(backend.all_gather_object(self.liveness.card()))

    def close_liveness(self) -> None:
        """Stop answering pings (on the way out)."""
        if self.liveness is not None:
            self.liveness.close()

    def explain_stall(self) -> Optional[str]:
        """After a failed or stalled collective: where the other ranks are, in one line (the ones that stopped
        taking part, or that every rank is alive and where), or None."""
        return self.liveness.explain() if self.liveness is not None else None

    def start(self) -> None:
        """Install the signal handlers (after the backend's init: MPI may install handlers of its own)
        and start the watchdog; the backend's own timeouts should fire first."""

        def request_stop(signum: int, frame: object) -> None:
            if signum == signal.SIGTERM and self.signal == signum and \
                    time.monotonic() - self._signalled_at < SAME_REQUEST_S:
                return  # one request passed on twice: a scheduler's SIGTERM, and its launcher's after it
            if self.signal is not None and signum == self.signal:  # the second one: stop at once
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            self.signal, self._signalled_at = signum, time.monotonic()
            if signum != signal.SIGTERM:
                signal.signal(signum, signal.SIG_DFL)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, request_stop)
        self._last_check_time = time.monotonic()
        backend = self.backend
        # Under Horovod elastic a rank that leaves is no failure: the job re-forms without it.
        gone = None if backend.elastic or self.liveness is None else self.liveness.gone
        self.watchdog = CollectiveWatchdog(backend.activity, self.timeout_s + WATCHDOG_GRACE_S, self._waited_too_long,
                                           gone=gone, on_gone=self._peers_gone)

    def agreed(self, step: int, now: bool = False) -> Optional[int]:
        """At the agreed steps (or `now`; a collective on every rank): the signal to stop at, if any rank
        was asked to stop (this rank's signal, or SIGTERM when the request reached only other ranks).

        The ranks also agree on the next check: as many steps as take CHECK_PERIOD_S at the mean step time
        since the last check. Every rank sums the same integers (microseconds), so every rank computes
        the same next step, whatever the order of the sum."""
        if step < self.next_check and not now:
            return None
        elapsed_us = round((time.monotonic() - self._last_check_time) * 1e6)
        with self.backend.activity.waiting("the stop agreement"):
            asking, total_us = self.backend.all_reduce_sum([1.0 if self.signal else 0.0, float(elapsed_us)])
        steps = max(step - self._last_check_step, 1)
        step_us = max(total_us / self.backend.world_size / steps, 1.0)
        self.next_check = step + min(max(int(CHECK_PERIOD_S * 1e6 // step_us), 1), MAX_CHECK_EVERY)
        self._last_check_step, self._last_check_time = step, time.monotonic()
        return (self.signal or int(signal.SIGTERM)) if asking else None

    def close(self) -> None:
        """Training is over: stop watching."""
        if self.watchdog is not None:
            self.watchdog.stop()

    def leave_stopped(self, signum: int, close: Callable[[], None]) -> NoReturn:
        """End this rank after an agreed stop (its checkpoint written) with 128 + the signal, once `close` has
        closed its files. The launcher is taking the job down: no goodbyes from the backend, which can wait
        for it (MPI_Finalize waits on an mpirun that is aborting the job until it kills the rank)."""
        self.close()
        close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)

    def leave_failed(self) -> NoReturn:
        """Any other failure (call it while handling the exception) ends this rank, loudly and at once: the
        traceback, where the other ranks are, and one error line. No graceful shutdown: the other ranks may be
        waiting in a collective that will never complete, and a clean shutdown would wait for them too."""
        self.close()  # the watchdog must not cut the explanation short
        traceback.print_exc()
        stall = self.explain_stall()
        if stall:
            print_error(self.prog, stall, self.backend.rank)
        self._leave(f"rank {self.backend.rank} failed (traceback above); the launcher stops the other ranks", None)

    def _waited_too_long(self, waited_s: float) -> None:
        """Watchdog expiry: say how long this rank waited and where every other rank is, then end it."""
        activity = self.backend.activity
        self._leave(f"waited {waited_s:.0f} s in {activity.doing} at step {activity.step} (--timeout "
                    f"{self.timeout_s:g})", self.explain_stall())

    def _peers_gone(self, gone: List[PeerState]) -> None:
        """A rank this one waits for has ended: no collective can complete, so end this rank now."""
        activity = self.backend.activity
        ranks = ", ".join(str(peer.rank) for peer in gone)
        gone_s = "its process is gone" if len(gone) == 1 else "their processes are gone"
        self._leave(f"rank{'s' if len(gone) > 1 else ''} {ranks} stopped taking part ({gone_s}; this rank was waiting "
                    f"in {activity.doing} at step {activity.step}, which cannot complete without "
                    f"{'it' if len(gone) == 1 else 'them'})", None)

    def _leave(self, first: str, second: Optional[str]) -> NoReturn:
        rank = self.backend.rank
        print_error(self.prog, first, rank)
        if second:
            print_error(self.prog, second, rank)
        sys.stdout.flush()
        if self.liveness is not None:  # the stopped processes of ranks on this host that explain_stall() found
            self.liveness.end_stopped()
        os._exit(1)
