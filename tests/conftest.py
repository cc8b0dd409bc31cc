import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

from cluster import cluster  # noqa: E402,F401  (the simulated two-host cluster, one per session)
from launch import Runs  # noqa: E402


@pytest.fixture(scope="session")
def runs(tmp_path_factory, worker_id):
    """Training runs shared by all tests of the session, across its xdist workers: runs(launcher, np, args) ->
    Launched."""
    # Every worker's basetemp lies in one folder of the session; alone (-n 0) the session's basetemp is it.
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    root = shared / "shared-runs"
    root.mkdir(exist_ok=True)
    return Runs(root)


# Modules that use the simulated cluster: it is one per machine, so they run on one worker, one after another.
CLUSTER_MODULES = {"test_compare_hosts.py", "test_doctor.py", "test_launch_errors.py", "test_multinode.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Give each xdist worker whole modules (their module-scoped runs are launched once), and every module
    that uses the cluster to the same worker; the modules with the most tests go first."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "cluster" if Path(module).name in CLUSTER_MODULES else module

    return ModuleScheduling(config, log)
