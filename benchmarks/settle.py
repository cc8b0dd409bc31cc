"""Wait for a quiet machine: return once the 1-minute load has fallen to half of what benchmarks.machine
calls under load (the benchmark's own start-up raises it before the result records it), or after --max-s
seconds. benchmarks/run_all.sh runs it before each full step, so that a step does not start under the load
its predecessor left: each result records the load it started under, and that load should be another
program's.

    python -m benchmarks.settle --max-s 300
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, Optional, Sequence

from .machine import cores, load, under_load

#: the share of the under-load threshold the load must fall to
QUIET_SHARE = 0.5


def quiet(now: Dict[str, float]) -> bool:
    """Whether a load leaves room for a benchmark's own start-up below the under-load threshold."""
    return not under_load({"1m": now["1m"] / QUIET_SHARE}, cores())


def settle(max_s: float, poll_s: float = 5.0, read_load: Callable[[], Dict[str, float]] = load) -> float:
    """Wait until the machine is quiet, at most `max_s` seconds; the seconds waited."""
    start = time.monotonic()
    while not quiet(read_load()) and time.monotonic() - start < max_s:
        time.sleep(poll_s)
    return time.monotonic() - start


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.settle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-s", type=float, default=300.0, help="wait at most this long (seconds)")
    args = p.parse_args(argv)
    waited = settle(args.max_s)
    now = load()
    if not quiet(now):
        print(f"settle: the 1-minute load is still {now['1m']:.2f} on {cores()} cores after {waited:.0f} s; "
              "the next result may be measured under load", flush=True)
    elif waited >= 1:
        print(f"settle: waited {waited:.0f} s for the load to fall to {now['1m']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
