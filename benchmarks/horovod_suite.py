"""Horovod's own test suite and examples, from a Horovod checkout, on the project's Horovod API and on real Horovod,
side by side, test by test.

    python -m benchmarks.horovod_suite --horovod PATH/TO/horovod --np 2,3
    python -m benchmarks.horovod_suite --horovod PATH/TO/horovod --np 2 --runs api --no-examples

The suite is the checkout's test/parallel/test_torch.py (its test/utils/common.py imports `mock`: pip install mock),
at each world size under:

- api:          torchrun --nproc-per-node N -m ddp_train.horovod_api -m pytest test_torch.py ...
- horovod-mpi:  horovodrun -np N --mpi python -m pytest test_torch.py ... (Horovod's MPI controller)
- horovod-gloo: horovodrun -np N --gloo python -m pytest test_torch.py::TorchTests::TEST, one launch per test (the
                suite shuts Horovod down after every test and initializes it again, which aborts Horovod 0.28.1's
                Gloo controller)

Every test runs under a time limit (pytest-timeout, --test-timeout). A launch that makes no progress for that long
and --hang-grace more (a rank blocked inside Horovod's C++, which pytest-timeout cannot interrupt) is stopped, its
test recorded as hung, and the tests after it run in a new launch; a launch that dies in a test records it as
crashed and goes on the same way. A small pytest plugin writes each rank's outcomes as they happen (nothing is lost
when a launch is stopped); a test passes when it passed on every rank. The API runs with
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (--api-stall-s) below the time limit, so that a collective some ranks never
join fails with its stall error rather than the time limit.

The examples (unless --no-examples), unchanged: pytorch_mnist.py on small MNIST files written here, real Horovod
(horovodrun --gloo) against the API at each world size, compared by the final weights of the model its
DistributedOptimizer trains; pytorch_synthetic_benchmark.py, pytorch_imagenet_resnet50.py (on a small ImageFolder
written here) and examples/elastic/pytorch/pytorch_mnist_elastic.py (torchrun --max-restarts 1) on the API.
Writes DIR/horovod_suite.json.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from argparse import Namespace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from common import launch
from common.compare.arguments import csv_list, world_sizes

from .horovod_api import command
from .jobs import add_out, job_env, parser, refuse, run_cli
from .machine import Record, publish

RUNS = ("api", "horovod-mpi", "horovod-gloo")
PLUGIN = "horovod_suite_report"
#: the pytest plugin that writes each rank's events, one JSON line each, to $HOROVOD_SUITE_REPORT/rank<R>.jsonl
PLUGIN_SOURCE = textwrap.dedent('''
    import json, os

    def _rank():
        for name in ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK"):
            if os.environ.get(name, "").isdigit():
                return int(os.environ[name])
        return 0

    def _write(event):
        folder = os.environ["HOROVOD_SUITE_REPORT"]
        with open(os.path.join(folder, "rank%d.jsonl" % _rank()), "a") as out:
            out.write(json.dumps(event) + "\\n")

    def pytest_runtest_logstart(nodeid, location):
        _write({"test": nodeid, "event": "start"})

    def pytest_runtest_logreport(report):
        message = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2])
        elif report.failed:
            message = (getattr(report, "longreprtext", "") or "").strip().splitlines()[-1:] or [""]
            message = message[0][-500:]
        _write({"test": report.nodeid, "event": report.when, "outcome": report.outcome, "message": message})

    def pytest_runtest_logfinish(nodeid, location):
        _write({"test": nodeid, "event": "finish"})
''')
Events = dict[int, list[dict]]  # rank -> what the plugin wrote of one test


def outcome(end: str, ranks: list[str], message: str = "", seconds: float | None = None) -> dict[str, Any]:
    """A test's outcome in one run: passed / failed / skipped on every rank, or hung / crashed / not run."""
    return {"outcome": end, "ranks": ranks, "message": message, "seconds": seconds}


def suite_tests(test_file: Path) -> list[str]:
    """The suite's tests in the order pytest runs them: unittest methods of each TestCase, sorted by name."""
    classes = [node for node in ast.parse(test_file.read_text()).body if isinstance(node, ast.ClassDef)]
    return [f"{test_file.name}::{c.name}::{test}" for c in classes
            for test in sorted(n.name for n in c.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test"))]


def rank_outcome(events: list[dict]) -> str:
    """One rank's outcome of one test from its reports (setup, call, teardown)."""
    phases = {e["event"]: e for e in events if e["event"] in ("setup", "call", "teardown")}
    if any(p["outcome"] == "skipped" for p in phases.values()):
        return "skipped"
    if phases.get("teardown", {}).get("outcome") == "failed" and phases.get("call", {}).get("outcome") == "passed":
        return "error"
    if any(p["outcome"] == "failed" for p in phases.values()):
        return "failed"
    return "passed" if "call" in phases else "not run"


def combine(per_rank: Events, np: int) -> dict[str, Any]:
    """A test's outcome over the ranks: what every rank agrees on, else failed (the first failure's message)."""
    outcomes = [rank_outcome(per_rank.get(rank, [])) for rank in range(np)]
    messages = [e.get("message", "") for rank in range(np) for e in per_rank.get(rank, []) if e.get("message")]
    started = any(e["event"] == "start" for rank in range(np) for e in per_rank.get(rank, []))
    agreed = outcomes[0] if len(set(outcomes)) == 1 else ("failed" if "failed" in outcomes else outcomes[0])
    return outcome(agreed, outcomes, messages[0] if messages else "", 0.0 if started else None)


def read_events(folder: Path) -> dict[str, Events]:
    """test -> rank -> its events, from the plugin's files (a line cut short by a stopped launch is passed over)."""
    found: dict[str, Events] = {}
    for path in sorted(folder.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            found.setdefault(event["test"], {}).setdefault(int(path.stem[4:]), []).append(event)
    return found


def launched(cmd: list[str], cwd: Path, env: dict[str, str], report: Path, stalled_s: float) -> bool:
    """Run one launch until it ends or its ranks report nothing for `stalled_s`: whether it was stopped as hung."""
    last_size, last_change = -1, time.monotonic()
    with launch.Job(cmd, env=env, cwd=cwd, log=report.parent / "logs" / f"{report.name}.log") as job:
        while job.poll() is None:
            time.sleep(1.0)
            size = sum(p.stat().st_size for p in report.glob("rank*.jsonl"))
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            elif time.monotonic() - last_change > stalled_s:
                job.stop()
                return True
        job.wait()
    return False


def run_suite(label: str, np: int, tests: list[str], args: Namespace, folder: Path,
              plugin_dir: Path) -> tuple[dict[str, dict], list[str]]:
    """Every test's outcome in one run, resuming after a hung or crashed test, and its launches' commands. The run's
    tests share a launch, but under horovodrun --gloo each has its own."""
    one_per_test, remaining = label == "horovod-gloo", list(tests)
    results: dict[str, dict] = {}
    commands: list[str] = []
    while remaining:
        batch = remaining[:1] if one_per_test else remaining
        report = args.work / f"{label}-{np}-{len(commands)}"
        shutil.rmtree(report, ignore_errors=True)
        report.mkdir(parents=True)
        env: dict[str, str | None] = {
            "HOROVOD_SUITE_REPORT": str(report), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        if label == "api":
            env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(args.api_stall_s)
        cmd = command(label, np, ["-m", "pytest"], [*batch, "-p", "no:cacheprovider", "-p", PLUGIN, "-q", "-o",
                                                    "addopts=", "--rootdir", str(folder), "--timeout",
                                                    f"{args.test_timeout:g}"])
        commands.append(" ".join(cmd))
        started = time.monotonic()
        hung = launched(cmd, folder, job_env(env), report, args.test_timeout + args.hang_grace)
        events = read_events(report)
        done = [t for t in batch if t in events and all(
            any(e["event"] == "finish" for e in events[t].get(rank, [])) for rank in range(np))]
        results.update({test: combine(events[test], np) for test in done})
        unfinished = [t for t in batch if t not in done]
        if unfinished:
            culprit = next((t for t in unfinished if t in events), unfinished[0])
            results[culprit] = outcome("hung" if hung else "crashed",
                                       [rank_outcome(events.get(culprit, {}).get(r, [])) for r in range(np)],
                                       "stopped: no progress" if hung else "the launch ended inside this test",
                                       time.monotonic() - started if one_per_test else None)
            remaining = remaining[remaining.index(culprit) + 1:]
        else:
            remaining = remaining[len(batch):]
        print(f"horovod_suite: {label} at {np}: {len(results)}/{len(tests)} tests", flush=True)
    return results, commands


# --- the examples ------------------------------------------------------------------------------------------------
#: runs a script as python would, then rank 0 saves the parameters its (last) DistributedOptimizer trained
SAVER_SOURCE = textwrap.dedent('''
    import atexit, runpy, sys
    import torch
    import horovod.torch as hvd

    script, out = sys.argv[1], sys.argv[2]
    wrapped, ranks = [], []
    make = hvd.DistributedOptimizer

    def capture(optimizer, *args, **kwargs):
        wrapped.append(make(optimizer, *args, **kwargs))
        ranks.append(hvd.rank())
        return wrapped[-1]

    def save():  # at exit, possibly after Horovod shut down: the rank was noted while it ran
        if wrapped and ranks[-1] == 0:
            torch.save([p.detach().clone() for g in wrapped[-1].param_groups for p in g["params"]], out)

    hvd.DistributedOptimizer = capture
    atexit.register(save)
    sys.argv = [script, *sys.argv[3:]]
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
''')


def write_mnist(root: Path, train: int, test: int, seed: int = 0) -> None:
    """root/MNIST/raw/*-ubyte in the idx format torchvision reads."""
    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        images, labels = rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
            (raw / f"{prefix}-{kind}-ubyte").write_bytes(header + array.astype(np.uint8).tobytes())


def write_imagefolder(root: Path, classes: int, per_class: int, seed: int = 0) -> None:
    """root/{train,val}/<class>/<i>.png."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (64, 72, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def run_example(cmd: list[str], work: Path, log: str, timeout_s: float,
                env: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """One launch of an example, in `work`, with one thread per rank: how it ended."""
    result = launch.run(cmd, timeout=timeout_s, env=job_env({"OMP_NUM_THREADS": "1", **(env or {})}), cwd=work,
                        log=work / "logs" / log)
    return {"command": " ".join(cmd), "returncode": result.returncode, "timed_out": result.timed_out,
            "seconds": round(result.seconds, 1), "tail": "" if result.returncode == 0 else result.output[-1500:]}


def compare_weights(a: Path, b: Path) -> dict[str, Any]:
    """Whether two saved lists of parameters are bitwise equal, and ‖a − b‖ / ‖a‖."""
    import torch

    if not (a.exists() and b.exists()):
        return {"compared": False}
    left, right = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    bitwise = len(left) == len(right) and all(torch.equal(x, y) for x, y in zip(left, right, strict=True))
    norm = sum(float((x.double() - y.double()).norm() ** 2) for x, y in zip(left, right, strict=True)) ** 0.5
    scale = sum(float(x.double().norm() ** 2) for x in left) ** 0.5
    return {"compared": True, "bitwise_equal": bitwise, "relative_difference": norm / scale if scale else None}


def examples(checkout: Path, sizes: Sequence[int], work: Path, timeout_s: float) -> dict[str, Any]:
    """Horovod's example scripts, unchanged, on the API (and pytorch_mnist.py against real Horovod)."""
    scripts = checkout / "examples" / "pytorch"
    work.mkdir(parents=True, exist_ok=True)
    saver, data, images = work / "run_and_save.py", work / "mnist", work / "imagefolder"
    saver.write_text(SAVER_SOURCE)
    write_mnist(data, train=512, test=128)
    mnist_args = ["--epochs", "1", "--batch-size", "32", "--data-dir", str(data), "--no-cuda"]
    out: dict[str, Any] = {"pytorch_mnist": {}}
    for ranks in sizes:
        # Horovod's fusion groups a sum by timing; with HOROVOD_FUSION_THRESHOLD=0 it reduces each tensor alone.
        for fusion, env in (("", {}), ("-fusion-off", {"HOROVOD_FUSION_THRESHOLD": "0"})):
            if fusion and ranks < 3:
                continue  # at 2 ranks the grouping changes no bit
            key = f"{ranks}{fusion}"
            case = out["pytorch_mnist"][key] = {"env": env}
            for label in ("horovod-gloo", "api"):
                saved = [str(scripts / "pytorch_mnist.py"), str(work / f"mnist-{label}-{key}.pt"), *mnist_args]
                case[label] = run_example(command(label, ranks, [str(saver)], saved), work,
                                          f"mnist-{label}-{key}.log", timeout_s, env)
            case["weights"] = compare_weights(*(work / f"mnist-{label}-{key}.pt" for label in ("horovod-gloo", "api")))
    synthetic = ["--model", "resnet18", "--batch-size", "8", "--no-cuda", "--num-warmup-batches", "1",
                 "--num-batches-per-iter", "1", "--num-iters", "2"]
    out["pytorch_synthetic_benchmark"] = run_example(
        command("api", 2, [str(scripts / "pytorch_synthetic_benchmark.py")], synthetic), work, "synthetic.log",
        timeout_s)
    elastic = command("api", 2, [str(checkout / "examples" / "elastic" / "pytorch" / "pytorch_mnist_elastic.py")],
                      mnist_args)
    out["pytorch_mnist_elastic"] = run_example([elastic[0], "--max-restarts=1", *elastic[1:]], work,
                                               "mnist_elastic.log", timeout_s)
    write_imagefolder(images, classes=2, per_class=4)
    imagenet = ["--train-dir", str(images / "train"), "--val-dir", str(images / "val"), "--epochs", "1",
                "--batch-size", "2", "--val-batch-size", "2", "--no-cuda", "--log-dir", str(work / "tb"),
                "--checkpoint-format", str(work / "checkpoint-{epoch}.pth.tar")]
    out["pytorch_imagenet_resnet50"] = run_example(
        command("api", 2, [str(scripts / "pytorch_imagenet_resnet50.py")], imagenet), work, "imagenet.log", timeout_s)
    out["pytorch_imagenet_resnet50"]["checkpoint_written"] = (work / "checkpoint-1.pth.tar").exists()
    return out


def revision(checkout: Path) -> str | None:
    """The checkout's commit, None where git cannot tell (a folder that is not a git checkout of its own: git would
    answer with the repository around it)."""
    try:
        done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--show-toplevel", "HEAD"],
                              capture_output=True, text=True, timeout=20)
    except OSError:
        return None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != checkout.resolve():
        return None
    return lines[1]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite and the examples; 2 on bad input."""
    p = parser("horovod_suite", __doc__)
    p.add_argument("--horovod", type=Path, required=True, help="a Horovod checkout (its test/ and examples/)")
    p.add_argument("--np", type=world_sizes, default=[2, 3], help="world sizes, e.g. 2,3")
    p.add_argument("--runs", type=csv_list(str, RUNS), default=",".join(RUNS), help=f"which of {', '.join(RUNS)}")
    p.add_argument("--test-timeout", type=float, default=60.0, help="seconds one test may take")
    p.add_argument("--hang-grace", type=float, default=60.0, help="more seconds without progress before a launch "
                                                                  "is stopped as hung")
    p.add_argument("--api-stall-s", type=float, default=20.0, help="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS of the API")
    p.add_argument("--select", default="", help="only the tests whose names contain this text")
    p.add_argument("--no-examples", action="store_true", help="skip the example scripts")
    p.add_argument("--no-suite", action="store_true", help="only the example scripts (the suite's results are kept "
                                                         "from the JSON already in --out)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "horovod_suite",
                   help="reports, logs and data (not kept)")
    add_out(p, "where horovod_suite.json goes")
    args = p.parse_args(argv)
    args.horovod, kept = args.horovod.resolve(), args.out / "horovod_suite.json"  # the launches run in the suite's
    test_file = args.horovod / "test" / "parallel" / "test_torch.py"  # folder
    if not test_file.is_file():
        return refuse("benchmarks.horovod_suite", f"{test_file}: no such file; give the folder of a Horovod checkout "
                                                  "(git clone of horovod/horovod)")
    if importlib.util.find_spec("mock") is None:
        return refuse("benchmarks.horovod_suite", "Horovod's test/utils/common.py imports mock: pip install mock")
    if args.no_suite and not kept.is_file():
        return refuse("benchmarks.horovod_suite", f"--no-suite keeps the suite's results of {kept}: none there; run "
                                                  "the suite first")
    record = Record("horovod_suite", argv)
    if args.no_suite:
        report = json.loads(kept.read_text())
        report["examples"] = examples(args.horovod, args.np, args.work / "examples", timeout_s=900)
        report["examples_measured"] = {key: value for key, value in record.header().items()
                                       if key in ("started", "command", "load_before", "load_after", "under_load")}
        return publish(report, kept)
    plugin_dir = args.work / "plugin"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    (plugin_dir / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
    tests = [test for test in suite_tests(test_file) if args.select in test]
    runs: list[dict[str, Any]] = []
    per_test: dict[str, dict] = {test: {} for test in tests}
    for ranks in args.np:
        for label in args.runs:
            started = time.monotonic()
            results, commands = run_suite(label, ranks, tests, args, test_file.parent, plugin_dir)
            ended: dict[str, int] = {}
            for test, result in results.items():
                per_test[test][f"{label}@{ranks}"] = result
                ended[result["outcome"]] = ended.get(result["outcome"], 0) + 1
            runs.append({"label": label, "np": ranks, "counts": ended, "seconds": time.monotonic() - started,
                         "launches": len(commands), "command": commands[0] if commands else None})
    report = {**record.header(), "horovod_checkout": str(args.horovod), "horovod_revision": revision(args.horovod),
              "test_file": "test/parallel/test_torch.py", "tests": len(tests), "test_timeout_s": args.test_timeout,
              "hang_grace_s": args.hang_grace, "api_stall_shutdown_s": args.api_stall_s, "runs": runs,
              "results": per_test, "failures": []}
    if not args.no_examples:
        report["examples"] = examples(args.horovod, args.np, args.work / "examples", timeout_s=900)
    return publish(report, kept)


if __name__ == "__main__":
    sys.exit(run_cli(main, "benchmarks.horovod_suite"))
