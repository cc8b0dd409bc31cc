"""`compare-backends --port train.py` on a team's codebase in its untouched folder (tests/projects.py: an entry script
and a package whose modules use Horovod; it resumes from the newest checkpoint in its working directory), with the
model's auxiliary head used on every other step (parameters without a gradient in some steps) and weight decay: the
comparison ports the script's folder into its output, runs the Horovod codebase and the port each in a working
directory of its own, and finds them equal within the noise floor at 3 ranks (2 ranks, where any correct pair is
bitwise identical, is test_port_project's); no run failed, no run resumed from another's checkpoint, and the user's
folder is left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.rundir.names import SUMMARY_FILE
from launched import compare_backends
from projects import write_project

pytestmark = pytest.mark.timeout(900)

ARGS = ["--epochs", "2", "--aux", "--wd", "1e-4"]


def files_of(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """The comparison at 3 ranks (where two correct implementations can differ), from the project's folder, its
    output outside it: (summary, output printed, out, the folder's files before, after)."""
    here = tmp_path_factory.mktemp("compare_project")
    folder = write_project(here / "project")
    before = files_of(folder)
    out = here / "out"
    result = compare_backends("--port", "train.py", "--zero-step", "keep", "--np", "3", "--hvd-controllers", "gloo",
                              "--repeats", "1", "--floor-runs", "2", "--out", out, "--", *ARGS, cwd=folder,
                              timeout=900)
    assert result.returncode == 0, result.output[-4000:]
    return json.loads((out / SUMMARY_FILE).read_text()), result.output, out, before, files_of(folder)


def pair_at(summary: dict, np: int) -> dict:
    pairs = [p for p in summary["parity"] if p["world_size"] == np and "+perturbed" not in p["a"] + p["b"]
             and {p["a"].split("@")[0], p["b"].split("@")[0]} == {"ddp", "horovod-gloo"}]
    assert len(pairs) == 1, summary["parity"]
    return pairs[0]


def test_the_codebases_port_is_within_the_floor_at_3_ranks(compared):
    summary, output, _, _, _ = compared
    assert "FAILED" not in output
    at3 = pair_at(summary, 3)
    assert at3["bitwise_identical"] or at3["within_noise_floor"] is True, at3
    assert at3["trains_differently_from"] is None and "beyond" not in at3["verdict"]


def test_the_folder_is_ported_into_the_output_and_the_users_folder_left_as_it_was(compared):
    _, _, out, before, after = compared
    assert after == before
    assert not (out / "port" / "trainkit" / "engine.py").read_text().count("horovod")
    assert "find_unused_parameters=True" in (out / "port" / "train.py").read_text()
    report = (out / "report.md").read_text()
    assert "trainkit/engine.py:13" in report


def test_no_run_resumed_from_what_another_wrote(compared):
    summary, _, out, _, _ = compared
    steps_per_run = {}
    for run in summary["runs"]:
        run_dir = Path(run["path"])
        events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps_per_run[(run["name"], run["world_size"])] = len([e for e in events if e["event"] == "step"])
    # 192 samples, 16 a batch, 2 passes a step: 2 steps an epoch at 3 ranks; 2 epochs from the start in every run
    assert len(steps_per_run) >= 2 and set(steps_per_run.values()) == {4}, steps_per_run
