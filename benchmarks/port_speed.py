"""How long `python -m ddp_train.port` takes on a 300-line Horovod script.

The script is examples/migrating/train_horovod.py with metric functions in its style added until it is --lines
long (each averages a metric with hvd.allreduce and prints it on rank 0), so that every rule that script uses
runs on every repeat. Each repeat runs the command as a user does, in a process of its own; the port's JSON
report gives the seconds it spent parsing and rewriting, the rest is starting Python and importing LibCST.

    python -m benchmarks.port_speed --lines 300 --repeats 5 --out benchmarks/results

Writes DIR/port_speed.json and prints a table.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from common.errors import print_error

from .jobs import add_out, parser, refuse, run_cli
from .machine import REPO, Record

EXAMPLE = REPO / "examples" / "migrating" / "train_horovod.py"
TARGET_S = 1.0
DEFINITIONS = {"rewrite_s": "seconds the port spent parsing, rewriting and writing (its report's `seconds`)",
               "command_s": "seconds of the whole command: Python's start, imports, the rewrite, the report",
               "target_s": "the port must take less than this on a 300-line script"}
METRIC = '''

def metric_{i}(value):
    """Average metric {i} over the workers and print it on the first."""
    tensor = torch.tensor(value)
    average = hvd.allreduce(tensor, name='metric_{i}')
    if hvd.rank() == 0:
        print('metric {i}: {{:.4f}}'.format(average.item()))
    return average.item()
'''
MAIN_GUARD = "\n\nif __name__ == '__main__':"


def script_of(lines: int) -> str:
    """The example with metric functions inserted before its main guard until it has at least `lines` lines."""
    head, guard, tail = EXAMPLE.read_text().partition(MAIN_GUARD)
    extra, i = "", 0
    while len((head + extra + guard + tail).splitlines()) < lines:
        extra += METRIC.format(i=i).rstrip("\n") + "\n"
        i += 1
    return head + extra + guard + tail


def measure(script: Path, repeats: int) -> tuple[list[float], list[float]]:
    """(rewrite seconds, command seconds) of each repeat."""
    rewrite, command = [], []
    for repeat in range(repeats):
        out, report = script.with_name(f"port_{repeat}.py"), script.with_name(f"port_{repeat}.json")
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ddp_train.port", str(script), "-o", str(out),
                               "--report-json", str(report)], capture_output=True, text=True)
        command.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"the port exited {done.returncode}: {done.stderr.strip()[-500:]}")
        rewrite.append(json.loads(report.read_text())["seconds"])
    return rewrite, command


def main(argv: Sequence[str] | None = None) -> int:
    """Measure; 1 when the port failed, 2 on bad input."""
    p = parser("port_speed", __doc__)
    p.add_argument("--lines", type=int, default=300, help="the script's length in lines")
    p.add_argument("--repeats", type=int, default=5, help="runs of the command")
    add_out(p)
    args = p.parse_args(argv)
    if args.lines < 1 or args.repeats < 1:
        return refuse("port_speed", "--lines and --repeats must be at least 1")
    record = Record("port_speed", argv)
    with tempfile.TemporaryDirectory(prefix="port_speed-") as work:
        script = Path(work) / "train_horovod.py"
        script.write_text(script_of(args.lines))
        try:
            rewrite, command = measure(script, args.repeats)
        except RuntimeError as exc:
            print_error("port_speed", str(exc), ranked=False)
            return 1
        row = {"lines": len(script.read_text().splitlines()), "rewrite_s": rewrite, "command_s": command,
               "rewrite_median_s": statistics.median(rewrite), "command_median_s": statistics.median(command)}
    return record.publish(args.out, settings={"lines": args.lines, "repeats": args.repeats},
                          definitions=DEFINITIONS, target_s=TARGET_S, rows=[row], failures=[])


if __name__ == "__main__":
    sys.exit(run_cli(main, "port_speed"))
