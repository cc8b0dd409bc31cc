import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

from cluster import cluster  # noqa: E402,F401  (the simulated two-host cluster, one per session)
from launch import Runs  # noqa: E402


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Training runs shared by all tests of the session: runs(launcher, np, args) -> Launched."""
    return Runs(tmp_path_factory.mktemp("shared-runs"))
