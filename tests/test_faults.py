"""Faults end the whole job cleanly: a signal to the launcher (also when steps take seconds), a rank
killed, a rank raising, a rank stuck; one-host jobs listen on loopback only."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import psutil
import pytest

from datasets import write_imagefolder
from launched import command, launch, read_run
from processes import (LOOPBACK, Job, assert_nothing_left, job_processes, listening, steps_logged, wait_ended,
                       worker)
from settings import TWO_RANK
from common.rundir.names import METRICS_FILE, SUMMARY_FILE

LONG = ["--model", "mlp", "--epochs", "400", "--threads", "1"]
# Steps of six seconds: more than the 5 s Horovod's own horovodrun gives its workers to stop. A user model
# (--model MODULE:FUNCTION) whose forward pass waits, so the steps are slow without taking the cores from
# the launchers and the signal they are timed on.
SLOW_MODEL = '''
    """A linear classifier whose training forward pass takes `seconds`."""
    import time

    from torch import nn


    class SlowSteps(nn.Module):
        def __init__(self, num_classes, channels, image_size, seconds):
            super().__init__()
            self.seconds = seconds
            self.head = nn.Linear(channels * image_size * image_size, num_classes)

        def forward(self, images):
            if self.training:
                time.sleep(self.seconds)
            return self.head(images.flatten(1))


    def build(num_classes, channels, image_size, seconds=6.0):
        return SlowSteps(num_classes, channels, image_size, seconds)
'''
SLOW = ["--model", "slow_steps:build", "--model-arg", "seconds=6", "--dataset", "digits", "--batch-size", "32",
        "--epochs", "2", "--threads", "1", "--log-every", "1"]
#: --timeout of the killed-, stuck- and slow-rank jobs. It also bounds how long a rank waits for a slower one in a
#: collective, the first broadcast included: beside the rest of the suite on two cores a rank was seen to reach
#: its first broadcast 8 s after the other, so the bound leaves room for more than twice that.
STUCK_TIMEOUT_S = 20
#: a job must have named its frozen or killed rank, and ended, within this many seconds of the freeze or kill
ENDED_WITHIN_S = STUCK_TIMEOUT_S + 15
PROG = {"torchrun": "ddp_train", "horovodrun-gloo": "hvd_train", "horovodrun-mpi": "hvd_train", "mpirun": "hvd_train"}


def _stopped_with_a_checkpoint(run_dir, output):
    events = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    stopped = [e for e in events if e["event"] == "stopped"]
    assert stopped, f"no final checkpoint:\n{output[-3000:]}"
    assert any(e["event"] == "checkpoint" and e["step"] == stopped[0]["step"] for e in events)
    # The run continues from there.
    from common.checkpoints.format import find_newest_valid
    ckpt, _, problems = find_newest_valid(str(run_dir))
    assert ckpt["step"] == stopped[0]["step"] and not problems


@dataclass
class Ended:
    """A job a module fixture ran: its run directory, the launcher's exit code (None: it ran past its bound and
    was stopped) and its output."""

    run_dir: Path
    code: Optional[int]
    output: str


@dataclass
class Stopped(Ended):
    """A slow-step job sent Ctrl-C: how long its steps took, the ranks still running when its bound ran out,
    how long they took to end."""

    step_s: float
    alive: list
    took: float


@pytest.fixture(scope="module")
def ctrl_c_stopped(tmp_path_factory) -> Dict[str, Stopped]:
    """Ctrl-C at each launcher's terminal (SIGINT to its process group) once its job has logged two slow
    steps. The four jobs run at once: they spend their steps waiting, and each is timed on its own."""
    jobs, stopped = {}, {}
    with ExitStack() as cleanup:
        for launcher in TWO_RANK:
            folder = tmp_path_factory.mktemp(f"ctrl-c-{launcher}")
            (folder / "slow_steps.py").write_text(textwrap.dedent(SLOW_MODEL))
            run_dir = folder / "run"
            jobs[launcher] = (cleanup.enter_context(Job(command(launcher, 2, SLOW + ["--run-dir", str(run_dir)]),
                                                        cwd=folder)), run_dir)
        # Each job is sent its Ctrl-C as soon as it has logged its second step, at the start of its third, not when
        # the slowest has: a job signalled late in a step may need the next one too before it can stop.
        signalled, deadline = {}, time.monotonic() + 180
        while len(signalled) < len(jobs):
            for launcher, (job, run_dir) in jobs.items():
                if launcher in signalled:
                    continue
                logged = steps_logged(run_dir)
                if len(logged) >= 2:
                    ranks = [worker(str(run_dir), rank) for rank in range(2)]
                    signalled[launcher] = (ranks, max(e["step_s"] for e in logged[1:]), time.monotonic())
                    os.killpg(job.pid, signal.SIGINT)
                else:
                    assert job.poll() is None, f"{launcher} ended before two steps:\n{job.output[-3000:]}"
            assert time.monotonic() < deadline, f"never logged two steps: {sorted(set(jobs) - set(signalled))}"
            time.sleep(0.05)
        for launcher, (ranks, step_s, sent) in signalled.items():
            alive = wait_ended(ranks, timeout=max(0.0, sent + 15 + step_s - time.monotonic()))
            took = time.monotonic() - sent
            job, run_dir = jobs[launcher]
            code = job.ended_within(30)  # mpirun itself waits out its timeout once more
            stopped[launcher] = Stopped(run_dir, code, job.output, step_s=step_s, alive=alive, took=took)
    return stopped


@pytest.mark.parametrize("launcher", TWO_RANK)
def test_ctrl_c_stops_slow_steps_within_15_s_plus_a_step_with_a_checkpoint(ctrl_c_stopped, launcher):
    """Ctrl-C at the launcher's terminal (SIGINT to its process group). Launchers give their workers only
    seconds (torchrun 30 s, horovodrun 30 s in the project's build, 5 s in Horovod's; mpirun passes the
    signal on after odls_base_sigkill_timeout, 5 s from the launch layer, and kills as long after): the
    ranks stop at the end of their step, longer than Horovod's own 5 s, with a checkpoint."""
    stopped = ctrl_c_stopped[launcher]
    assert not stopped.alive, f"ranks still running {stopped.took:.1f} s after Ctrl-C with {stopped.step_s:.1f} s steps"
    # horovodrun (Gloo) can say 0 although its workers ended with 143: stopping them, it reaps a worker's shell
    # with psutil while its middleman waits on that shell too, and a middleman that loses gets no exit code
    # (ECHILD, which subprocess reports as 0). The workers' own end is checked below (checkpoint, "stopped by").
    assert stopped.code is not None, f"the launcher still ran 30 s after its ranks:\n{stopped.output[-3000:]}"
    assert stopped.code != 0 or launcher == "horovodrun-gloo", stopped.output[-3000:]
    assert_nothing_left(str(stopped.run_dir))
    _stopped_with_a_checkpoint(stopped.run_dir, stopped.output)
    assert "stopped by SIG" in stopped.output


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-gloo"])
def test_sigterm_to_launcher_stops_every_rank_with_a_checkpoint(tmp_path, launcher):
    run_dir = tmp_path / "run"
    job = Job(command(launcher, 2, LONG + ["--run-dir", str(run_dir)]))
    job.wait_for(r"epoch 2 step")
    sent = time.monotonic()
    job.send_signal(signal.SIGTERM)
    code = job.wait(timeout=15)
    assert code != 0 and time.monotonic() - sent < 15
    assert_nothing_left(str(run_dir))
    _stopped_with_a_checkpoint(run_dir, job.output)


@dataclass
class Killed(Ended):
    """A job whose rank 1 was killed: the addresses each of its processes listened on before (pid -> name,
    command line, addresses), its ranks, how long the launcher took to end after the kill."""

    found: dict
    ranks: list
    took: float


def _listeners(job: Job) -> Dict[int, tuple]:
    """pid -> (name, command line, addresses it listens on) for the launcher and every process it started."""
    found = {}
    for proc, addresses in listening(job).items():
        try:
            found[proc.pid] = (proc.name(), proc.cmdline()[:4], addresses)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(scope="module")
def rank_killed(tmp_path_factory) -> Dict[str, Killed]:
    """Under each launcher, a job in its second epoch: the addresses it listens on, then its rank 1 killed.
    The four jobs start at once; each is killed when it gets there and timed on its own."""
    jobs, killed = {}, {}
    with ExitStack() as cleanup:
        for launcher in TWO_RANK:
            run_dir = tmp_path_factory.mktemp(f"killed-{launcher}") / "run"
            args = LONG + ["--timeout", str(STUCK_TIMEOUT_S), "--run-dir", str(run_dir)]
            jobs[launcher] = (cleanup.enter_context(Job(command(launcher, 2, args))), run_dir)
        seen, sent = {}, {}
        for launcher, (job, run_dir) in jobs.items():
            job.wait_for(r"epoch 2 step")
            # Killed as soon as its job is there: a job left training would take the cores from the others.
            ranks = [worker(str(run_dir), rank) for rank in range(2)]
            seen[launcher] = (_listeners(job), ranks)
            ranks[1].kill()
            sent[launcher] = time.monotonic()
        for launcher, (job, run_dir) in jobs.items():
            code = job.ended_within(max(1.0, sent[launcher] + ENDED_WITHIN_S - time.monotonic()))
            found, ranks = seen[launcher]
            killed[launcher] = Killed(run_dir, code, job.output, found=found, ranks=ranks,
                                      took=time.monotonic() - sent[launcher])
    return killed


@pytest.mark.parametrize("launcher", TWO_RANK)
def test_one_host_job_listens_on_loopback_and_a_killed_rank_ends_it(rank_killed, launcher):
    killed = rank_killed[launcher]
    for rank in killed.ranks:
        assert rank.pid in killed.found, f"rank process {rank.pid} listens nowhere"
    for name, cmdline, addresses in killed.found.values():
        if name in ("mpirun", "orterun", "orted"):
            continue  # Open MPI's own daemon binds its out-of-band channel to every interface (docs/multinode)
        assert all(a in LOOPBACK for a in addresses), (cmdline, addresses)
    assert killed.code is not None, \
        f"still running {ENDED_WITHIN_S} s after rank 1 was killed:\n{killed.output[-3000:]}"
    assert killed.code != 0 and killed.took < ENDED_WITHIN_S
    assert_nothing_left(str(killed.run_dir))
    assert re.search(r"(rank\s*:\s*1\b|Process name: 1\b|\[\[\d+,\d+\],1\]|rank 1 )", killed.output), \
        killed.output[-3000:]
    if launcher in ("horovodrun-mpi", "mpirun"):
        # Open MPI passes SIGTERM on to the survivor only 5 s after the death (odls_base_sigkill_timeout), and
        # kills it 5 s later: its own watchdog sees the gone rank first and ends it.
        assert re.search(r"\[rank 0\] hvd_train: error: rank 1 stopped taking part \(its process is gone",
                         killed.output), killed.output[-3000:]
    assert not (killed.run_dir / SUMMARY_FILE).exists()


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-mpi"])
def test_a_rank_that_raises_ends_the_job_and_is_named(tmp_path, launcher):
    data = write_imagefolder(tmp_path / "data", classes=2, per_class=16, size=16)
    run_dir = tmp_path / "run"
    job = Job(command(launcher, 2, ["--dataset", "imagefolder", "--data-dir", str(data), "--image-size", "16",
                                    "--model", "mlp", "--batch-size", "2", "--epochs", "400", "--threads", "1",
                                    "--run-dir", str(run_dir)]))
    job.wait_for(r"epoch 2 step")
    victim = sorted((data / "train").rglob("*.png"))[0]
    victim.write_bytes(b"not a png any more")  # unreadable mid-run: the rank that reads it raises
    code = job.wait(timeout=60)
    assert code != 0
    assert_nothing_left(str(run_dir))
    assert re.search(rf"\[rank (\d)\] {PROG[launcher]}: error: rank \1 failed", job.output), job.output[-3000:]
    assert "UnidentifiedImageError" in job.output or "cannot identify image" in job.output


#: the frozen rank is named by hvd_train's watchdog and the job ended by mpirun under both Open MPI launchers:
#: horovodrun --mpi starts the same mpirun with the same flags, so mpirun alone adds no other path
STUCK_LAUNCHERS = tuple(launcher for launcher in TWO_RANK if launcher != "mpirun")


@dataclass
class Stuck(Ended):
    """A job whose rank 1 was frozen: seconds from the freeze until rank 0 named it, and until the job had
    ended (None: it had not within ENDED_WITHIN_S)."""

    named: Optional[float]
    ended: Optional[float]


def _followed(job: Job, launcher: str) -> tuple:
    """(seconds until the live rank of `job` names its frozen rank 1, seconds until the job ends), from now;
    None for what did not happen within ENDED_WITHIN_S. Nothing here touches the frozen rank: the job must
    end by itself."""
    started, named = time.monotonic(), None
    pattern = re.compile(rf"\[rank 0\] {PROG[launcher]}: error: rank 1 stopped taking part")
    while time.monotonic() - started < ENDED_WITHIN_S:
        ended = job.proc.poll() is not None
        if named is None and pattern.search(job.output):
            named = time.monotonic() - started
        if ended:
            return named, time.monotonic() - started
        time.sleep(0.1)
    return named, None


@pytest.fixture(scope="module")
def rank_stuck(tmp_path_factory) -> Dict[str, Stuck]:
    """Under each of STUCK_LAUNCHERS, a job with a short --timeout whose rank 1 is frozen (SIGSTOP) in its second
    epoch and left frozen. The jobs start one after another, each once the one before has its rank frozen (all
    starting together on two cores would take long to start); each is followed from its own freeze."""
    jobs, follows, stuck = {}, {}, {}
    with ExitStack() as cleanup, ThreadPoolExecutor(len(STUCK_LAUNCHERS)) as pool:
        for launcher in STUCK_LAUNCHERS:
            run_dir = tmp_path_factory.mktemp(f"stuck-{launcher}") / "run"
            job = cleanup.enter_context(Job(command(launcher, 2, LONG + ["--timeout", str(STUCK_TIMEOUT_S),
                                                                          "--run-dir", str(run_dir)])))
            jobs[launcher] = (job, run_dir)
            job.wait_for(r"epoch 2 step")
            worker(str(run_dir), 1).send_signal(signal.SIGSTOP)
            follows[launcher] = pool.submit(_followed, job, launcher)
        for launcher, (job, run_dir) in jobs.items():
            named, ended = follows[launcher].result()
            code = job.ended_within(10) if ended is not None else None  # and its last output read
            if named is None and ended is not None:
                named = ended if re.search(rf"\[rank 0\] {PROG[launcher]}: error: rank 1 stopped taking part",
                                           job.output) else None
            if ended is None:
                for proc in job_processes(str(run_dir)):  # what is left, frozen or not, goes
                    with contextlib.suppress(psutil.Error):
                        proc.kill()
                job.ended_within(10)
            stuck[launcher] = Stuck(run_dir, code, job.output, named=named, ended=ended)
    return stuck


@pytest.mark.parametrize("launcher", STUCK_LAUNCHERS)
def test_a_stuck_rank_is_named_and_the_job_ends_within_the_timeout(rank_stuck, launcher):
    """A rank that is alive, holding its connections, and takes no part (SIGSTOP): the live rank names it, and
    the job ends with nothing left behind, the frozen rank included, within --timeout + 15 s, on both
    backends and under both Horovod controllers. (A stopped process keeps the launcher's SIGTERM pending:
    the rank that names it ends it as it leaves.)"""
    stuck = rank_stuck[launcher]
    assert stuck.named is not None, f"rank 1 never named:\n{stuck.output[-3000:]}"
    assert stuck.named < ENDED_WITHIN_S, f"named {stuck.named:.0f} s after the rank stopped"
    assert stuck.ended is not None, f"still running {ENDED_WITHIN_S} s after rank 1 froze:\n{stuck.output[-3000:]}"
    assert stuck.code != 0, stuck.output[-3000:]
    assert "its process is stopped" in stuck.output, stuck.output[-3000:]
    assert_nothing_left(str(stuck.run_dir), within=1)


# A user model whose forward pass, on rank 1 only and once, waits longer than --timeout: a rank that is alive
# and answers, only slow.
SLOW_RANK_MODEL = '''
    """A linear classifier whose training forward pass number `at` sleeps `seconds` on rank 1."""
    import os
    import time

    from torch import nn


    class SlowRank(nn.Module):
        def __init__(self, num_classes, channels, image_size, at, seconds):
            super().__init__()
            rank = next(os.environ[v] for v in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK") if v in os.environ)
            self.slow, self.at, self.seconds, self.calls = rank == "1", at, seconds, 0
            self.head = nn.Linear(channels * image_size * image_size, num_classes)

        def forward(self, images):
            if self.training:
                self.calls += 1
                if self.slow and self.calls == self.at:
                    time.sleep(self.seconds)
            return self.head(images.flatten(1))


    def build(num_classes, channels, image_size, at=5, seconds=60.0):
        return SlowRank(num_classes, channels, image_size, at, seconds)
'''
SLOW_AT = 5
SLOW_RANK = ["--model", "slow_rank:build", "--model-arg", f"at={SLOW_AT}",
             "--model-arg", f"seconds={STUCK_TIMEOUT_S + 20}", "--dataset", "digits", "--batch-size", "32",
             "--epochs", "1", "--threads", "1", "--timeout", str(STUCK_TIMEOUT_S)]


@pytest.fixture(scope="module")
def rank_slow(tmp_path_factory) -> Dict[str, Ended]:
    """Under torchrun (DDP) and horovodrun (Horovod, Gloo), a job whose rank 1 computes one step for longer
    than --timeout. The two jobs run at once: they spend that step waiting."""
    jobs = {}
    with ExitStack() as cleanup:
        for launcher in ("torchrun", "horovodrun-gloo"):
            folder = tmp_path_factory.mktemp(f"slow-{launcher}")
            (folder / "slow_rank.py").write_text(textwrap.dedent(SLOW_RANK_MODEL))
            run_dir = folder / "run"
            jobs[launcher] = (cleanup.enter_context(Job(command(launcher, 2, SLOW_RANK + ["--run-dir", str(run_dir)]),
                                                        cwd=folder)), run_dir)
        return {launcher: Ended(run_dir, job.ended_within(240), job.output)
                for launcher, (job, run_dir) in jobs.items()}


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-gloo"])
def test_a_slow_rank_is_named_as_alive_and_computing(rank_slow, launcher):
    """The live rank's collective waits past --timeout and the job fails; its line says that rank 1 is alive
    and computing at its step, not that it stopped taking part. (Rank 1, once awake, rightly finds rank 0
    gone.)"""
    slow = rank_slow[launcher]
    assert slow.code is not None and slow.code != 0, slow.output[-3000:]
    assert re.search(rf"\[rank 0\] {PROG[launcher]}: error: every rank answers: rank 1 is alive and computing "
                     rf"\(forward, backward and the optimizer step\) at step {SLOW_AT - 1}\b", slow.output), \
        slow.output[-3000:]
    assert not re.search(r"\[rank 0\].*rank 1 stopped taking part", slow.output), slow.output[-3000:]
    assert_nothing_left(str(slow.run_dir))


def test_torchrun_restart_resumes_and_ends_bitwise_equal(tmp_path):
    """torchrun --max-restarts 1 with --resume auto: a rank killed once costs only a restart."""
    args = ["--model", "mlp", "--epochs", "4", "--threads", "1", "--checkpoint-every", "5", "--resume", "auto"]
    undisturbed = tmp_path / "undisturbed"
    launch("torchrun", 2, args + ["--run-dir", str(undisturbed)]).check()

    run_dir = tmp_path / "restarted"
    cmd = command("torchrun", 2, args + ["--run-dir", str(run_dir)])
    job = Job(cmd[:1] + ["--max-restarts=1"] + cmd[1:])
    job.wait_for(r"epoch 2 step")
    worker(str(run_dir), 1).kill()
    assert job.wait(timeout=120) == 0, job.output[-3000:]
    assert "resuming from" in job.output
    assert read_run(run_dir)["summary"]["weights_sha256"] == read_run(undisturbed)["summary"]["weights_sha256"]
    assert_nothing_left(str(run_dir))
