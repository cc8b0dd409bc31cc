"""Start training runs through the real launchers (common.launch) and read what they wrote."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import re
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from common import launch as launch_layer
from common.rundir.names import TENSORBOARD_DIR
from common.rundir.reader import read_files

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
BIN = Path(PY).parent


def command(launcher: str, np: int, args: List[str]) -> List[str]:
    """The command line a user would type for this launcher."""
    return launch_layer.get(launcher).command(np, args, python=PY)


def command_on_hosts(launcher: str, np: int, hosts: str, args: List[str], port: Optional[int] = None) -> List[str]:
    """The command a user types to start `np` processes on `hosts` ("node0:2,node1:2"); torchrun's is
    started on every host, with its rendezvous on the first at `port`."""
    return launch_layer.get(launcher).command(np, args, python=PY, hosts=hosts, port=port)


def backend_of(launcher: str) -> str:
    """Which backend a launcher runs."""
    return launch_layer.get(launcher).backend


class Result(launch_layer.Result):
    """What a launched job returned and printed."""

    def check(self) -> "Result":
        assert self.returncode == 0 and not self.timed_out, \
            f"{' '.join(self.cmd)} exited {self.returncode}:\n{self.output[-4000:]}"
        return self


def job_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment a run gets: the venv first on PATH, unbuffered output (each job then gets a temporary
    folder of its own from common.launch.jobs.Job, for Open MPI's sessions and torchrun's logs)."""
    return launch_layer.job_env(extra, python=PY)


def run_cmd(cmd: List[str], timeout: float = 240, env: Optional[Dict[str, str]] = None,
            cwd: Path = REPO) -> Result:
    """Run a command as a job of its own (from the repository unless `cwd` says otherwise); a run past
    `timeout` is stopped and fails."""
    result = launch_layer.run(cmd, timeout=timeout, env=job_env(env), cwd=cwd)
    assert not result.timed_out, f"{' '.join(result.cmd)} did not finish in {timeout}s:\n{result.output[-4000:]}"
    return Result(**vars(result))


#: `python -m common.compare` as a command line, for a comparison that launches runs (in a process of its own, as a
#: user starts it; a host of the simulated cluster starts it the same way)
COMPARE = [PY, "-m", "common.compare"]


def compare(*args, timeout: float = 600, env: Optional[Dict[str, str]] = None, cwd: Path = REPO) -> Result:
    """`python -m common.compare ARGS` in a process of its own, from `cwd`: a comparison that launches runs."""
    return run_cmd([*COMPARE, *map(str, args)], timeout=timeout, env=env, cwd=cwd)


def compare_backends(*args, timeout: float = 600, env: Optional[Dict[str, str]] = None, cwd: Path = REPO) -> Result:
    """`compare-backends ARGS` (the installed command) from `cwd`: as a user starts the comparison from a folder of
    scripts, whose own `common` module `python -m common.compare` would find first."""
    return run_cmd([str(BIN / "compare-backends"), *map(str, args)], timeout=timeout, env=env, cwd=cwd)


@dataclass
class Compared:
    """What a comparison run in this process returned and printed."""

    returncode: int
    output: str


def compare_in_process(*args) -> Compared:
    """`python -m common.compare ARGS` (its command line is sys.exit(main())) run in this process, for a comparison
    that launches nothing: of given run directories (--runs), or refused before anything starts. Its exit code and
    what it printed, stdout and stderr together."""
    from common.compare.__main__ import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            code = main(list(map(str, args)))
        except SystemExit as exc:  # the option parser's own refusals
            code = exc.code
    return Compared(code, printed.getvalue())


def launch(launcher: str, np: int, args: List[str], timeout: float = 240,
           env: Optional[Dict[str, str]] = None) -> Result:
    """Launch one training job the way a user would."""
    return run_cmd(command(launcher, np, args), timeout=timeout, env=env)


@dataclass
class Launched:
    """A training run launched by Runs: what it wrote, what it printed, where."""

    run: Dict
    result: Result
    dir: Path


class Runs:
    """Training runs launched once per test session and shared by every test that asks for the same
    (launcher, processes, arguments, launcher options): each assertion reads the run it needs without
    paying for a launch of its own. The pytest-xdist workers share `root`: the first to ask for a run
    launches it holding the run's lock file while the others wait for it, then each reads what it wrote."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: Dict[Tuple, Launched] = {}

    def __call__(self, launcher: str, np: int, args: Sequence[str], launcher_args: Sequence[str] = (),
                 timeout: float = 240) -> Launched:
        key = (launcher, np, tuple(args), tuple(launcher_args))
        if key not in self.cache:
            name = f"{launcher}-{np}-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"
            run_dir = self.root / name
            cmd = command(launcher, np, [*args, "--run-dir", str(run_dir)])
            result = self.once(name, cmd[:1] + list(launcher_args) + cmd[1:], timeout).check()
            self.cache[key] = Launched(read_run(run_dir), result, run_dir)
        return self.cache[key]

    def once(self, name: str, cmd: List[str], timeout: float) -> Result:
        """What `cmd` returned and printed, run once per session under `name`: the first worker to ask runs it
        holding NAME.lock while the others wait, then each reads the record it left."""
        printed = self.root / f"{name}.result.json"
        with open(self.root / f"{name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not printed.exists():
                printed.write_text(json.dumps(vars(run_cmd(cmd, timeout=timeout))))
        return Result(**json.loads(printed.read_text()))


def rank_exit_codes(launcher: str, output: str) -> dict:
    """Each rank's exit code, as the launcher (or, under Open MPI, the shell around each rank) reported it."""
    if launcher == "torchrun":  # its failure summary: "rank : 1 (local_rank: 1)" then "exitcode : 2"
        pairs = re.findall(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", output)
    elif launcher == "horovodrun-gloo":
        pairs = re.findall(r"Process (\d+) exit with status code (-?\d+)", output)
    else:
        pairs = re.findall(r"rank (\d+) exited (\d+)", output)
    return {int(rank): int(code) for rank, code in pairs}


def assert_every_rank_exited(launcher: str, output: str, world_size: int, code: int) -> None:
    """Each rank's exit code, as its launcher reported it, is `code`. horovodrun (Gloo) stops the other ranks
    as soon as one has ended: a rank that ends in that moment can go unreported (the middleman waiting on it
    loses the exit status to horovodrun's own reaping: ECHILD, read as 0, so no line), or be reported with 143,
    the SIGTERM horovodrun sent the shell it runs the rank in. Only when horovodrun says it stopped the others
    may ranks be missing or 143; the rank whose failure it names must have `code`; the ranks' own lines show
    they all ended."""
    codes = rank_exit_codes(launcher, output)
    stopped = re.search(r"Terminating remaining workers after failure of Process (\d+)", output)
    if launcher == "horovodrun-gloo" and stopped:
        first = int(stopped[1])
        assert codes.get(first) == code and set(codes) <= set(range(world_size)), output[-3000:]
        assert all(c in (code, 143) for r, c in codes.items() if r != first), output[-3000:]
    else:
        assert codes == {rank: code for rank in range(world_size)}, output[-3000:]


def read_run(run_dir: Path) -> Dict:
    """config.json, summary.json, metrics events and model.pt of a run directory (common.rundir.reader)."""
    return read_files(run_dir)


def tensorboard_scalars(run_dir: Path) -> Dict[str, List[Tuple[int, float]]]:
    """Every scalar series of RUN_DIR/tensorboard: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(run_dir) / TENSORBOARD_DIR))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def step_losses(run: Dict) -> List[float]:
    """Rank 0's loss at every logged step."""
    return [e["loss"] for e in run["events"] if e["event"] == "step"]


def max_abs_diff(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    """Largest element-wise |a - b| over two state_dicts with the same keys."""
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a)


def share_apart(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], by: float) -> float:
    """The share of the weights of two state_dicts (same keys) that differ by more than `by`."""
    assert a.keys() == b.keys()
    apart = sum(int(((a[k].double() - b[k].double()).abs() > by).sum()) for k in a)
    return apart / sum(a[k].numel() for k in a)


def assert_summary_leads(out: Path) -> None:
    """A comparison's report opens with the summary every mode writes (--runs, --scripts, --hosts, --slurm: one
    builder, common/compare/report.py): its table first, with summary.json's cells, then the speed and runs lines."""
    report = (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())["summary"]
    lead = report.split("\n## ")[1]
    assert lead.startswith("Summary\n\n| world size | " + " | ".join(summary["columns"]) + " |"), report[:800]
    for row in summary["rows"]:
        for cell in row["cells"].values():  # as a markdown table cell holds it
            assert cell["text"].replace("|", "\\|") in lead, (cell["text"], lead)
    assert summary["runs"] in lead and lead.count("\n\n") >= 3, lead
