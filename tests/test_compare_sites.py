"""compare-backends --slurm inside real allocations: salloc on node0 of the Slurm cluster of the two simulated
hosts (tests/slurm_cluster.py), at 2 ranks (one on each node) and at 4 (two on each), every run of both backends
started with srun across both nodes, and the report; and the one-line refusals of sites that cannot run the
matrix asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launched import REPO, assert_summary_leads, compare_in_process
from common.rundir.names import CONFIG_FILE, SUMMARY_FILE

pytestmark = pytest.mark.multinode

#: world size -> the allocation it runs in: both nodes, half of the ranks on each
ALLOCATIONS = {2: ["salloc", "--nodes", "2", "--ntasks-per-node", "1"],
               4: ["salloc", "--nodes", "2", "--ntasks-per-node", "2"]}
SHORT = ["--repeats", "1", "--model", "mlp", "--dataset", "synthetic", "--max-steps", "6", "--threads", "1"]
#: at 4 ranks the backends differ in the last bits: judged against the tolerance only, without the noise floor's
#: and the explaining runs (test_compare_hosts and test_verdicts make those), which would double its runs
AT_4 = ["--explain", "none", "--noise-floor", "off"]
DOC = REPO / "docs" / "multinode-and-slurm.md"


def compare_command(np: int, out: Path) -> list:
    """compare-backends --slurm at `np` ranks in its allocation, as typed on node0."""
    extra = AT_4 if np == 4 else []
    return [*ALLOCATIONS[np], "python", "-m", "common.compare", "--slurm", "--np", str(np),
            "--rdzv-port", str(29620 + np), *SHORT, *extra, "--out", str(out)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Where the comparisons write: runs/ in docs/multinode-and-slurm.md."""
    return tmp_path_factory.mktemp("slurm-compare")


@pytest.fixture(scope="module")
def compared(slurm, folder):
    """Both comparisons, one allocation after the other: np -> (result, out folder, summary)."""
    found = {}
    for np in ALLOCATIONS:
        slurm.wait_until_idle()
        out = folder / f"compare-{np}"
        result = slurm.run(compare_command(np, out), timeout=300)
        summary = json.loads((out / SUMMARY_FILE).read_text()) if (out / SUMMARY_FILE).exists() else None
        found[np] = (result, out, summary)
    return found


@pytest.mark.parametrize("np", ALLOCATIONS)
def test_slurm_runs_both_backends_through_srun_across_both_nodes(compared, np):
    result, out, summary = compared[np]
    assert result.returncode == 0 and summary, result.output[-4000:]
    per_node = np // 2
    commands = {r["name"]: r["command"] for r in summary["runs"]}
    # At 2 ranks the backends end bitwise equal: no run but the two.
    assert sorted(commands) == [f"ddp@{np}#1", f"horovod-mpi@{np}#1"]
    shape = f"--nodes=2 --ntasks-per-node={per_node} --ntasks={np} "
    # DDP: one task per process, meeting at the allocation's first node; Horovod: PMIx, its MPI controller.
    assert commands[f"ddp@{np}#1"].startswith(f"env MASTER_ADDR=node0 MASTER_PORT={29620 + np} srun "
                                              f"--kill-on-bad-exit=1 {shape}"), \
        commands[f"ddp@{np}#1"]
    assert commands[f"horovod-mpi@{np}#1"].startswith(f"srun --mpi=pmix --kill-on-bad-exit=1 {shape}"), \
        commands[f"horovod-mpi@{np}#1"]
    for run in summary["runs"]:
        config = json.loads((Path(run["path"]) / CONFIG_FILE).read_text())
        assert config["launcher"] == "srun" and config["world_size"] == np
        assert config["rank_hosts"] == ["node0"] * per_node + ["node1"] * per_node, run["name"]
    pair, = [p for p in summary["parity"] if p["kind"] == "backends"]
    if np == 2:
        assert pair["verdict"] == "bitwise identical", pair["verdict"]
    else:
        assert pair["verdict"] == "bitwise identical" or pair["verdict"].startswith("equal within"), pair["verdict"]
    # Each speed verdict, in the summary and the report, says that the runs went across both nodes.
    assert all("across 2 hosts (node0, node1)" in v["verdict"] for v in summary["speed"]), summary["speed"]
    assert "across 2 hosts (node0, node1)" in (out / "report.md").read_text()
    assert_summary_leads(out)


def test_the_docs_give_each_command_as_run(compared, folder):
    text = DOC.read_text()
    for np in ALLOCATIONS:
        line = " ".join(compare_command(np, folder / f"compare-{np}")).replace(f"{folder}/", "runs/")
        assert f"node0$ {line}\n" in text, f"docs/multinode-and-slurm.md should give `node0$ {line}`"


def test_gloo_under_slurm_is_one_line_before_anything_starts(slurm, tmp_path):
    slurm.wait_until_idle()
    out = tmp_path / "out"
    result = slurm.run(["salloc", "--nodes", "1", "--ntasks-per-node", "1", "python", "-m", "common.compare",
                        "--slurm", "--hvd-controllers", "gloo", "--out", str(out)], timeout=120)
    assert result.returncode == 2, result.output[-3000:]
    errors = [line for line in result.output.splitlines() if "error" in line]
    assert errors == ["compare-backends: error: --slurm runs Horovod through srun with its MPI controller; Gloo "
                      "needs horovodrun (drop --hvd-controllers gloo)"], result.output
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--slurm"], "--slurm runs inside a Slurm allocation: start it with salloc or in an sbatch script"),
    (["--hosts", "node0:4,node1:4", "--np", "9"], "9 processes do not fit on node0:4,node1:4 (8 slots)"),
    (["--hosts", "node0:4,node1:4", "--np", "6"],
     "--np 6 on --hosts node0:4,node1:4 places node0:4,node1:2: torchrun starts the same number of processes on "
     "every host"),
    (["--hosts", "node0:x"], "bad host entry 'node0:x'"),
    (["--hosts", "node0:2", "--runs", "a", "b"], "--hosts says where to launch runs; --runs launches none"),
])
def test_a_site_that_cannot_run_the_matrix_is_one_line_before_anything_starts(tmp_path, monkeypatch, args, message):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # not in an allocation, whatever runs the tests
    result = compare_in_process(*args, "--out", tmp_path / "out")  # it launches nothing: run in this process
    assert result.returncode == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("compare-backends: error: ") and message in last, last
    assert not (tmp_path / "out").exists()
