"""The sbatch templates in slurm/, run as a one-node allocation would run them.

`srun` and `scontrol` are stand-ins (tests/slurm_shim) that set each task's Slurm variables as
srun does; the templates, torchrun and the entry points are the real ones.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from launched import BIN, REPO, job_env
from common.rundir.names import CONFIG_FILE, SUMMARY_FILE

SHIM = REPO / "tests" / "slurm_shim"
ARGS = ["--model", "mlp", "--max-steps", "6", "--threads", "1"]


def sbatch(template: str, tasks_per_node: int, args, extra=None) -> subprocess.CompletedProcess:
    """Run slurm/<template> the way sbatch would on a one-node allocation."""
    env = job_env({"PATH": f"{SHIM}:{BIN}:{job_env()['PATH']}", "SLURM_JOB_ID": "4242",
                   "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_NNODES": "1",
                   "SLURM_NTASKS_PER_NODE": str(tasks_per_node), "SLURM_SUBMIT_DIR": str(REPO),
                   "VENV": str(BIN.parent), **(extra or {})})
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(var, None)
    return subprocess.run(["bash", str(REPO / "slurm" / template), *args], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.parametrize("template,tasks,extra,launcher", [
    ("ddp_torchrun.sbatch", 1, {"PROCS_PER_NODE": "2"}, "torchrun"),
    ("ddp_srun.sbatch", 2, {}, "srun"),
    ("hvd_srun.sbatch", 2, {}, "mpirun"),
])
def test_sbatch_template_trains_on_two_ranks(tmp_path, template, tasks, extra, launcher):
    run_dir = tmp_path / "run"
    result = sbatch(template, tasks, ARGS + ["--run-dir", str(run_dir)],
                    {"MASTER_PORT": _free_port(), **extra})
    assert result.returncode == 0, result.stdout[-3000:]
    config = json.loads((run_dir / CONFIG_FILE).read_text())
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    assert config["world_size"] == 2 and summary["steps"] == 6
    assert config["launcher"] == launcher
    for rank in range(2):
        assert f"rank {rank}/2 local_rank {rank}/2" in result.stdout


def test_default_run_dir_is_named_after_the_job(tmp_path):
    """Without RUN_DIR the templates write runs/slurm-<job id> in the submit directory."""
    job = "slurmtest-" + tmp_path.name
    result = sbatch("ddp_srun.sbatch", 1, ARGS, {"SLURM_JOB_ID": job, "MASTER_PORT": _free_port()})
    run_dir = REPO / "runs" / f"slurm-{job}"
    try:
        assert result.returncode == 0, result.stdout[-3000:]
        assert (run_dir / SUMMARY_FILE).exists()
    finally:
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)
