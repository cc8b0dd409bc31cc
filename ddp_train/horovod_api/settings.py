"""The Horovod environment variables the API honours: every HOROVOD_* variable it reads is read here, into Settings.
The first init() keeps its Settings for the job (fusion, cycles, stalls, the cache); every init() reads them again
for what Horovod reads at each init (the timeline, dynamic process sets, elastic)."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Horovod 0.28.1's defaults
FUSION_THRESHOLD = 128 * 2 ** 20
CYCLE_TIME_MS = 1.0
STALL_CHECK_S = 60.0
CACHE_CAPACITY = 1024
#: the API's own: Horovod waits forever for a rank that stopped taking part (0); the API ends the wait after this
STALL_SHUTDOWN_S = 300.0


#: the values of a boolean variable that mean yes (any case); anything else, or unset, means no
TRUE = ("1", "true", "yes", "on")


def flag(name: str) -> bool:
    """Whether the boolean environment variable `name` is set to yes (1, true, yes or on)."""
    return os.environ.get(name, "").strip().lower() in TRUE


def _number(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        return float(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number; set it to a number or unset it") from None


@dataclass(frozen=True)
class Settings:
    """fusion_threshold: bytes of one fused allreduce (HOROVOD_FUSION_THRESHOLD; 0 reduces every tensor alone);
    cycle_time_s: how long complete allreduces wait for others to fuse with (HOROVOD_CYCLE_TIME, ms);
    stall_check_s: when a collective some ranks wait in is reported (HOROVOD_STALL_CHECK_TIME_SECONDS, 0 with
    HOROVOD_STALL_CHECK_DISABLE=1); stall_shutdown_s: when it fails on every rank that waits
    (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS; 0 waits forever, as Horovod does by default); cache_capacity: how many
    collectives the response cache keeps (HOROVOD_CACHE_CAPACITY; 0 sends every request to rank 0); timeline: where
    rank 0 writes the timeline from init() on (HOROVOD_TIMELINE; "" or DYNAMIC: only hvd.start_timeline starts it);
    timeline_mark_cycles: its CYCLE_START instants (HOROVOD_TIMELINE_MARK_CYCLES); dynamic_process_sets: process
    sets may be added and removed after init() (HOROVOD_DYNAMIC_PROCESS_SETS); elastic: the job runs under
    Horovod's elastic driver, so a DistributedOptimizer allreduces even alone (HOROVOD_ELASTIC)."""

    fusion_threshold: int = FUSION_THRESHOLD
    cycle_time_s: float = CYCLE_TIME_MS / 1000
    stall_check_s: float = STALL_CHECK_S
    stall_shutdown_s: float = STALL_SHUTDOWN_S
    cache_capacity: int = CACHE_CAPACITY
    timeline: str = ""
    timeline_mark_cycles: bool = False
    dynamic_process_sets: bool = False
    elastic: bool = False

    @classmethod
    def from_environment(cls) -> "Settings":
        """The settings the environment gives now; ValueError naming a variable that is not a number."""
        shutdown = _number("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", STALL_SHUTDOWN_S)
        check = _number("HOROVOD_STALL_CHECK_TIME_SECONDS", STALL_CHECK_S)
        if flag("HOROVOD_STALL_CHECK_DISABLE"):
            check = 0.0
        elif 0 < shutdown < check:
            check = shutdown  # Horovod would never shut down then; here the report comes when the wait ends
        return cls(fusion_threshold=int(_number("HOROVOD_FUSION_THRESHOLD", FUSION_THRESHOLD)),
                   cycle_time_s=_number("HOROVOD_CYCLE_TIME", CYCLE_TIME_MS) / 1000,
                   stall_check_s=check, stall_shutdown_s=shutdown,
                   cache_capacity=max(0, int(_number("HOROVOD_CACHE_CAPACITY", CACHE_CAPACITY))),
                   timeline=os.environ.get("HOROVOD_TIMELINE", "").strip(),
                   timeline_mark_cycles=flag("HOROVOD_TIMELINE_MARK_CYCLES"),
                   dynamic_process_sets=flag("HOROVOD_DYNAMIC_PROCESS_SETS"), elastic=flag("HOROVOD_ELASTIC"))

    @property
    def collective_timeout_s(self) -> float:
        """How long one collective of torch.distributed may wait for a peer: past the stall shutdown, or a day when
        stalls never end the job (a rank that dies mid-collective still ends it at once: its connections close)."""
        return max(self.stall_shutdown_s * 2, 120.0) if self.stall_shutdown_s > 0 else 86400.0
