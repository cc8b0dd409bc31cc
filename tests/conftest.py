import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest

from launched import COMPARE, Runs
from settings import ACROSS_HOSTS, DEMO
from common.rundir.names import SUMMARY_FILE

# Fixtures of their own modules: `cluster`, the simulated two-host cluster, and `slurm`, Slurm on it (one per session)
pytest_plugins = ("cluster", "slurm_cluster", "cpu_census")

# A suite started in the background (`make test &`, nohup in a script) inherits SIGINT ignored, and so would
# every job it starts; the tests send SIGINT as a terminal's Ctrl-C does, so jobs start with the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def runs(tmp_path_factory, worker_id):
    """Training runs shared by all tests of the session, across its xdist workers: runs(launcher, np, args) ->
    Launched."""
    # Every worker's basetemp lies in one folder of the session; alone (-n 0) the session's basetemp is it.
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    root = shared / "shared-runs"
    root.mkdir(exist_ok=True)
    return Runs(root)


@pytest.fixture(scope="session")
def demo(runs):
    """make demo's comparison (python -m common.compare, the default training) with one timing repeat: (output
    folder, what it printed, its summary). Made once per session beside the shared runs (Runs.once). test_compare reads
    the whole matrix, test_verdicts its 3-rank cell and noise floor, test_parity its DDP run at 2 ranks."""
    out = runs.root / "demo"
    result = runs.once("demo", [*COMPARE, "--out", str(out), "--repeats", "1", *DEMO], timeout=900)
    assert result.returncode == 0, result.output[-3000:]
    return out, result.output, json.loads((out / SUMMARY_FILE).read_text())


@pytest.fixture(scope="session")
def across_hosts(cluster, tmp_path_factory):
    """One comparison started on node0 across both hosts at world size 4: DDP and Horovod (Gloo and MPI, the default
    controllers at the largest world size).
    test_compare_hosts reads the comparison, test_multinode the runs it launched: (result, out, summary)."""
    out = tmp_path_factory.mktemp("across-hosts")
    result = cluster.run("node0", [*COMPARE, "--hosts", "node0:2,node1:2", "--np", "4",
                                   "--repeats", "1", "--explain", "none",
                                   "--floor-runs", "1", *ACROSS_HOSTS, "--out", str(out)], timeout=400)
    assert result.returncode == 0, result.output[-4000:]
    return result, out, json.loads((out / SUMMARY_FILE).read_text())


# Modules that use the simulated cluster: it is one per machine, so they run on one worker, one after another,
# and first: together they take the longest.
CLUSTER_MODULES = {"test_compare_hosts.py", "test_doctor.py", "test_launch_errors.py", "test_multinode.py",
                   "test_horovod_api_scale.py", "test_horovod_api_spark_cluster.py",
                   "test_shaped_link.py", "test_compare_sites.py", "test_slurm_and_schedule.py",
                   "test_slurm_templates.py"}
# Of those, the ones that use Slurm on the cluster go last: its daemons start with the first of them, and the
# others take node1's link down and up, which Slurm answers by setting the node DOWN for a while.
SLURM_MODULES = {"test_compare_sites.py", "test_slurm_and_schedule.py", "test_slurm_templates.py"}
# The other modules that take minutes on 2 cores, longest first, so that the two workers end together; the
# rest follow in their own order.
LONGEST_FIRST = ["test_benchmarks.py", "test_compare.py", "test_scripts.py", "test_faults.py", "test_exact.py",
                 "test_knobs.py", "test_plugins.py", "test_verdicts.py", "test_checkpoint.py",
                 "test_elastic.py", "test_parity.py"]


def pytest_collection_modifyitems(items):
    """Run the cluster's modules first (Slurm's last of them), then the others longest first (a stable sort:
    within a module, tests keep their order). A test that uses the cluster outside CLUSTER_MODULES would bring up
    a second one on the other worker, so it stops the session."""
    def rank(item):
        name = item.path.name
        if name in CLUSTER_MODULES:
            return 0.5 if name in SLURM_MODULES else 0
        if "cluster" in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid} uses the cluster: add {name} to CLUSTER_MODULES in "
                                    "tests/conftest.py")
        return 1 + (LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST))

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Give each xdist worker whole modules (their module-scoped runs are launched once), and every module
    that uses the cluster to the same worker, in the order of the collection (longest first)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # xdist would put the modules with the most tests first

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "cluster" if Path(module).name in CLUSTER_MODULES else module

    return ModuleScheduling(config, log)
