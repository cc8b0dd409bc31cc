"""What set-up (`make setup`, run by `make test` and `make demo`) leaves beside the venv and Horovod."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from common import launch as launch_layer
from launched import PY, run_cmd
from test_architecture import PACKAGES, REPO


def test_every_project_module_has_its_bytecode_written_by_set_up():
    """Every rank, launcher and comparison imports these modules; where PYTHONDONTWRITEBYTECODE is set no process
    writes their .pyc, so set-up compiles them (scripts/setup.sh, step 5). A module without current bytecode is
    one that each process would compile again."""
    stale = []
    for package in PACKAGES:
        for source in sorted((REPO / package).rglob("*.py")):
            cached = Path(importlib.util.cache_from_source(str(source)))
            if not cached.exists() or cached.stat().st_mtime < source.stat().st_mtime:
                stale.append(str(source.relative_to(REPO)))
    assert not stale, f"no current bytecode (run `make setup`): {stale}"


@pytest.mark.parametrize("launcher", ["horovodrun-gloo", "horovodrun-mpi"])
def test_horovodrun_starts_a_job_without_a_process_that_imports_torch(tmp_path, launcher):
    """Before it starts a job, horovodrun asks whether Horovod has Gloo (MPI); Horovod's own answer forks a process
    that imports torch, 1.5 CPU-s on every launch, and the project's build answers from what it built
    (docs/building-horovod.md). A torch that refuses to be imported and says so, first on the path of horovodrun and of
    everything it starts, catches any such process; the job's own process does not import torch."""
    tripwire = tmp_path / "tripwire" / "torch"
    tripwire.mkdir(parents=True)
    imported = tmp_path / "torch-imported"
    tripwire.joinpath("__init__.py").write_text(f"open({str(imported)!r}, 'w').close()\n"
                                                "raise ImportError('torch was imported')\n")
    cmd = launch_layer.get(launcher).command(1, [], module="platform", python=PY)
    result = run_cmd(cmd, env={"PYTHONPATH": str(tripwire.parent)}, timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    assert "Linux" in result.output  # the job ran: `python -m platform` printed the platform
    assert not imported.exists(), "horovodrun imported torch before it started the job"
