"""What set-up (`make setup`, run by `make test` and `make demo`) leaves beside the venv and Horovod."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
