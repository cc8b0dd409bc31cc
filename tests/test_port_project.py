"""The port of a team's codebase (tests/projects.py: train.py and a package whose data, engine and metrics modules use
Horovod, manual accumulation across modules, auto-resume from relative checkpoint paths), run as users run it: the
folder's port trains under torchrun with Horovod not importable and ends bitwise equal to the Horovod codebase under
horovodrun at 2 ranks, fresh and resumed from its own checkpoint. (Its auxiliary head, a branch skipped on some steps,
is proven by compare-backends --port in tests/test_compare_port_project.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import pytest

from ddp_train.port.__main__ import main as port_main
from launched import PY, Result, run_cmd
from projects import block_horovod, write_project

pytestmark = pytest.mark.timeout(900)

BIN = Path(PY).parent


def horovodrun(folder: Path, *args: str) -> Result:
    return run_cmd([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PY, "train.py", *args],
                   timeout=240, cwd=folder).check()


def torchrun(folder: Path, blocked: Path, *args: str) -> Result:
    return run_cmd([str(BIN / "torchrun"), "--rdzv-backend", "loopback", "--nproc-per-node", "2", "train.py", *args],
                   timeout=240, cwd=folder, env={"PYTHONPATH": str(blocked)}).check()


def final(folder: Path) -> Dict:
    return json.loads((folder / "final.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Dict[str, List[Dict]]:
    """Each codebase run twice in its own folder (1 epoch, then resumed to 2): what each wrote in final.json."""
    here = tmp_path_factory.mktemp("project")
    blocked = block_horovod(here / "blocked")
    horovod = write_project(here / "horovod")
    assert port_main([str(horovod), "-o", str(here / "ddp")]) == 0
    found: Dict[str, List[Dict]] = {"horovod": [], "ddp": []}
    for epochs in ("1", "2"):
        horovodrun(horovod, "--epochs", epochs)
        found["horovod"].append(final(horovod))
        torchrun(here / "ddp", blocked, "--epochs", epochs)
        found["ddp"].append(final(here / "ddp"))
    found["checkpoints"] = [sorted(p.name for p in (here / "ddp").glob("checkpoint-*.pt"))]  # type: ignore[list-item]
    return found


def test_the_folders_port_without_horovod_ends_bitwise_equal_to_horovod_at_2_ranks(runs):
    horovod, ddp = runs["horovod"][0], runs["ddp"][0]
    assert horovod["resumed_from"] == ddp["resumed_from"] == 0
    assert ddp["losses"] == horovod["losses"]
    assert ddp["sha256"] == horovod["sha256"]


def test_the_port_resumes_from_its_own_checkpoint_bitwise_equal_to_horovod_resumed(runs):
    horovod, ddp = runs["horovod"][1], runs["ddp"][1]
    assert horovod["resumed_from"] == ddp["resumed_from"] == 1
    assert ddp["losses"] == horovod["losses"] and ddp["sha256"] == horovod["sha256"]
    assert runs["checkpoints"] == [["checkpoint-1.pt", "checkpoint-2.pt"]]
