"""Wait for a quiet machine: return once the CPU is at most half as busy as a result may be before it counts as
measured under load (benchmarks.machine.BUSY_LIMIT), measured over 3 seconds, or after --max-s seconds.
benchmarks/run_all.sh runs it before each full step. It reads the CPU's use now, not the 1-minute load average,
which goes on showing a step for minutes after it ended.

    python -m benchmarks.settle --max-s 300
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from .jobs import parser
from .machine import BUSY_LIMIT, cores, cpu_busy, load

SAMPLE_S = 3.0  # seconds over which the CPU's use is measured, each time it is checked


def quiet(busy: float | None) -> bool:
    """Whether the CPU's use leaves half the under-load limit free; without /proc/stat the 1-minute load decides."""
    return (load()["1m"] if busy is None else busy * cores()) <= 0.5 * BUSY_LIMIT * cores()


def settle(max_s: float, poll_s: float = 2.0,
           read_busy: Callable[[], float | None] = lambda: cpu_busy(SAMPLE_S)) -> tuple[float, float | None]:
    """Wait until the machine is quiet, at most `max_s` seconds: (the seconds waited, the CPU's use last read)."""
    start = time.monotonic()
    busy = read_busy()
    while not quiet(busy) and time.monotonic() - start < max_s:
        time.sleep(poll_s)
        busy = read_busy()
    return time.monotonic() - start, busy


def main(argv: Sequence[str] | None = None) -> int:
    """Settle, saying so when the wait was long or in vain."""
    p = parser("settle", __doc__)
    p.add_argument("--max-s", type=float, default=300.0, help="wait at most this long (seconds)")
    waited, busy = settle(p.parse_args(argv).max_s)
    if not quiet(busy):
        print(f"settle: the CPU is still busy ({'unknown' if busy is None else f'{busy:.0%}'} of {cores()} cores) "
              f"after {waited:.0f} s; the next result may be measured under load", flush=True)
    elif waited >= SAMPLE_S + 1:
        print(f"settle: waited {waited:.0f} s for the CPU to fall quiet", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
