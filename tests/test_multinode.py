"""Training across two hosts (the simulated cluster of tests/cluster.py): every launcher, from node0,
with ranks on node0 and node1; the runs record both hosts, train like DDP within 1e-6 at world size 4,
and the comparison layer accepts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from launched import command_on_hosts, compare_in_process, max_abs_diff, read_run, step_losses
from settings import ACROSS_HOSTS, TWO_RANK
from common.rundir.names import SUMMARY_FILE

pytestmark = pytest.mark.multinode

HOSTS = "node0:2,node1:2"
#: the comparison across hosts (conftest.across_hosts) launched these, with the commands of the launch layer
COMPARED = {"torchrun": "ddp@4#1", "horovodrun-gloo": "horovod-gloo@4#1", "horovodrun-mpi": "horovod-mpi@4#1"}


@pytest.fixture(scope="module")
def runs(cluster, across_hosts, tmp_path_factory):
    """The two-host runs, shared by the tests: runs(launcher) -> (run dir contents, output, dir). Those of
    the comparison across hosts are read; mpirun's, which the comparison does not start, is launched here."""
    by_name = {run["name"]: Path(run["path"]) for run in across_hosts[2]["runs"]}
    cache = {}

    def get(launcher: str):
        if launcher not in cache:
            if launcher in COMPARED:
                run_dir = by_name[COMPARED[launcher]]
                output = (run_dir / "launch.log").read_text()
            else:
                run_dir = tmp_path_factory.mktemp(f"two-hosts-{launcher}")
                # What a user types on node0; ssh comes from the hosts' ssh config (key, known host keys).
                cmd = command_on_hosts(launcher, 4, HOSTS, [*ACROSS_HOSTS, "--run-dir", str(run_dir)])
                output = cluster.run("node0", cmd, timeout=240).check().output
            cache[launcher] = (read_run(run_dir), output, run_dir)
        return cache[launcher]

    return get


@pytest.mark.parametrize("launcher", TWO_RANK)
def test_launcher_trains_across_two_hosts(runs, launcher):
    run, output, _ = runs(launcher)
    config, summary = run["config"], run["summary"]
    assert config["world_size"] == summary["world_size"] == 4
    assert config["hosts"] == ["node0", "node1"]
    assert sorted(config["rank_hosts"]) == ["node0", "node0", "node1", "node1"]
    assert config["launcher"] == {"horovodrun-gloo": "horovodrun", "horovodrun-mpi": "mpirun"}.get(launcher, launcher)
    if launcher.startswith("horovodrun"):
        assert config["backend"]["controller"] == launcher.split("-")[1]
    assert summary["steps"] == 10 and len(step_losses(run)) == 10
    # Every rank's banner names the host it ran on.
    for host in ("node0", "node1"):
        assert output.count(f"host {host} ") == 2, output[-3000:]


@pytest.mark.parametrize("launcher", TWO_RANK[1:])
def test_horovod_across_hosts_matches_ddp_within_1e_6(runs, launcher):
    ddp, _, _ = runs("torchrun")
    hvd, _, _ = runs(launcher)
    assert max_abs_diff(ddp["model"], hvd["model"]) <= 1e-6
    assert step_losses(hvd) == pytest.approx(step_losses(ddp), rel=1e-5)


def test_compare_accepts_two_host_runs(runs, tmp_path):
    _, _, ddp_dir = runs("torchrun")
    _, _, hvd_dir = runs("horovodrun-gloo")
    out = tmp_path / "report"
    result = compare_in_process("--runs", ddp_dir, hvd_dir, "--out", out)
    assert result.returncode == 0, result.output[-3000:]
    report = (out / "report.md").read_text()
    assert "node1" in report, "the report's reproduction section names the hosts"
    assert (out / SUMMARY_FILE).exists()
