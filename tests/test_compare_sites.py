"""compare-backends --slurm inside an allocation (srun and scontrol are the stand-ins of tests/slurm_shim,
which start a one-node allocation's tasks as srun does), and the one-line refusals of sites that cannot
run the matrix asked for."""

from __future__ import annotations

import json
import os

import pytest

from launched import COMPARE, REPO, compare_in_process, run_cmd
from common.rundir.names import CONFIG_FILE, SUMMARY_FILE

SHIM = REPO / "tests" / "slurm_shim"
ALLOCATION = {"SLURM_JOB_ID": "4343", "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1",
              "SLURM_NTASKS_PER_NODE": "3", "PATH": f"{SHIM}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def in_allocation(tmp_path_factory):
    out = tmp_path_factory.mktemp("slurm-compare")
    result = run_cmd([*COMPARE, "--slurm", "--np", "3", "--repeats", "1", "--port", "29640", "--model", "mlp",
                      "--max-steps", "6", "--threads", "1", "--floor-runs", "1", "--out", str(out)], timeout=300,
                     env=ALLOCATION)
    return result, out


def test_slurm_runs_both_backends_through_srun(in_allocation):
    result, out = in_allocation
    assert result.returncode == 0, result.output[-4000:]
    summary = json.loads((out / SUMMARY_FILE).read_text())
    commands = {r["name"]: r["command"] for r in summary["runs"]}
    pair, = [p for p in summary["parity"] if p["kind"] == "backends"]
    # The noise floor's run (DDP again, one ulp off) is made, through srun too, only when the backends differ.
    floor = [] if pair["bitwise_identical"] else ["ddp+perturbed1@3#1"]
    assert sorted(commands) == sorted(["ddp@3#1", "horovod-mpi+predivide@3#1", "horovod-mpi@3#1"] + floor)
    for name in floor:
        assert commands[name].startswith("env MASTER_ADDR=localhost MASTER_PORT=") and "--perturb-ulp 1" in commands[name]
    # DDP: one task per process meeting at the allocation's first node; Horovod: PMI, its MPI controller.
    assert commands["ddp@3#1"].startswith("env MASTER_ADDR=localhost MASTER_PORT=29640 srun --nodes=1 "
                                          "--ntasks-per-node=3 --ntasks=3 "), commands["ddp@3#1"]
    assert commands["horovod-mpi@3#1"].startswith("srun --mpi=pmix --nodes=1 --ntasks-per-node=3 --ntasks=3 ")
    config = json.loads((out / "runs" / "ddp-np3-r1" / CONFIG_FILE).read_text())
    assert config["launcher"] == "srun" and config["world_size"] == 3
    assert pair["verdict"] == "bitwise identical" or pair["verdict"].startswith("equal within")
    if not pair["bitwise_identical"]:
        assert "dividing before the sum as DDP does (horovod-mpi+predivide)" in summary["explanations"][0]["text"]


@pytest.mark.parametrize("args, env, message", [
    (["--slurm"], {}, "--slurm runs inside a Slurm allocation: start it with salloc or in an sbatch script"),
    (["--slurm", "--hvd-controllers", "gloo"], ALLOCATION,
     "--slurm runs Horovod through srun with its MPI controller; Gloo needs horovodrun (drop --hvd-controllers gloo)"),
    (["--hosts", "node0:4,node1:4", "--np", "9"], {}, "9 processes do not fit on node0:4,node1:4 (8 slots)"),
    (["--hosts", "node0:4,node1:4", "--np", "6"], {},
     "--np 6 on --hosts node0:4,node1:4 places node0:4,node1:2: torchrun starts the same number of processes on "
     "every host"),
    (["--hosts", "node0:x"], {}, "bad host entry 'node0:x'"),
    (["--hosts", "node0:2", "--runs", "a", "b"], {}, "--hosts says where to launch runs; --runs launches none"),
])
def test_a_site_that_cannot_run_the_matrix_is_one_line_before_anything_starts(tmp_path, monkeypatch, args, env,
                                                                              message):
    if not env:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # not in an allocation, whatever runs the tests
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = compare_in_process(*args, "--out", tmp_path / "out")  # it launches nothing: run in this process
    assert result.returncode == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("compare-backends: error: ") and message in last, last
    assert not (tmp_path / "out").exists()
