"""Wait for a quiet machine: return once the CPU is at most half as busy as benchmarks.machine calls under load
(BUSY_LIMIT), measured over a few seconds, or after --max-s seconds. benchmarks/run_all.sh runs it before each
full step, so that a step does not start while its predecessor's processes still wind down or another program
works. It reads the CPU's use now, not the 1-minute load average, which goes on showing a step for minutes after
it ended (waiting for that to fall cost about two minutes per step and measured nothing).

    python -m benchmarks.settle --max-s 300
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Optional, Sequence, Tuple

from .machine import BUSY_LIMIT, cores, cpu_busy, load, under_load

#: the share of the under-load limit the CPU's use must fall to
QUIET_SHARE = 0.5
#: seconds over which the CPU's use is measured, each time it is checked
SAMPLE_S = 3.0


def quiet(busy: Optional[float]) -> bool:
    """Whether the CPU's use leaves room below the under-load limit; without a measure of it (no /proc/stat), the
    1-minute load must leave that room instead."""
    if busy is None:
        return not under_load({"1m": load()["1m"] / QUIET_SHARE}, cores())
    return busy <= QUIET_SHARE * BUSY_LIMIT


def settle(max_s: float, poll_s: float = 2.0,
           read_busy: Callable[[], Optional[float]] = lambda: cpu_busy(SAMPLE_S)) -> Tuple[float, Optional[float]]:
    """Wait until the machine is quiet, at most `max_s` seconds: (the seconds waited, the CPU's use last read)."""
    start = time.monotonic()
    busy = read_busy()
    while not quiet(busy) and time.monotonic() - start < max_s:
        time.sleep(poll_s)
        busy = read_busy()
    return time.monotonic() - start, busy


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.settle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-s", type=float, default=300.0, help="wait at most this long (seconds)")
    args = p.parse_args(argv)
    waited, busy = settle(args.max_s)
    if not quiet(busy):
        share = "unknown" if busy is None else f"{busy:.0%}"
        print(f"settle: the CPU is still busy ({share} of {cores()} cores) after {waited:.0f} s; the next result may "
              "be measured under load", flush=True)
    elif waited >= SAMPLE_S + 1:
        print(f"settle: waited {waited:.0f} s for the CPU to fall quiet", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
