"""srun without torchrun (Slurm's variables, as srun sets them) and the shared LR schedule."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from launched import PY, REPO, job_env
from common.rundir.names import CONFIG_FILE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _srun_like(ntasks: int, args, extra=None):
    """Start `ntasks` processes with the environment srun gives each task on one node."""
    procs = []
    for rank in range(ntasks):
        env = job_env({"SLURM_JOB_ID": "4242", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
                        "SLURM_NTASKS": str(ntasks), "SLURM_NODEID": "0",
                        "SLURM_STEP_TASKS_PER_NODE": str(ntasks), **(extra or {})})
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
            env.pop(var, None)
        procs.append(subprocess.Popen([PY, "-m", "ddp_train", *args], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
    outputs = []
    deadline = time.monotonic() + 180
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError("srun-like job hung")
        outputs.append((proc.returncode, out))
    return outputs


def test_ddp_under_srun_environment(tmp_path):
    port = _free_port()
    outputs = _srun_like(2, ["--model", "mlp", "--max-steps", "5", "--threads", "1", "--run-dir", str(tmp_path)],
                         {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    for rank, (code, out) in enumerate(outputs):
        assert code == 0, out
        assert f"[ddp] rank {rank}/2 local_rank {rank}/2" in out
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert config["world_size"] == 2 and config["launcher"] == "srun"
    assert config["backend"]["launch"] == "slurm"


def test_srun_without_master_addr_is_a_clear_error(tmp_path):
    outputs = _srun_like(2, ["--run-dir", str(tmp_path)])
    for rank, (code, out) in enumerate(outputs):
        assert code == 2
        assert f"[rank {rank}] ddp_train: error: under srun without torchrun, export MASTER_ADDR" in out


@pytest.mark.parametrize("spec,node,expected", [("4", 0, 4), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1)])
def test_slurm_tasks_per_node_parsing(spec, node, expected):
    from common.launch.placement import detect

    env = {"SLURM_STEP_TASKS_PER_NODE": spec, "SLURM_NODEID": str(node), "SLURM_PROCID": "0", "SLURM_NTASKS": "7"}
    placement = detect(env)
    assert (placement.launcher, placement.local_world_size) == ("srun", expected)


def test_linear_scaling_with_warmup_follows_horovods_rule():
    from common.config import Config
    from common.loop.optim import lr_at

    config = Config(lr=0.1, lr_scaling="linear", warmup_epochs=2)
    # 10 steps per epoch, 4 ranks: starts at lr, reaches 4 x lr after 2 epochs, then stays.
    assert lr_at(config, 0, 10, 100, 4) == pytest.approx(0.1)
    assert lr_at(config, 10, 10, 100, 4) == pytest.approx(0.25)
    assert lr_at(config, 20, 10, 100, 4) == pytest.approx(0.4)
    assert lr_at(config, 99, 10, 100, 4) == pytest.approx(0.4)
    step = Config(lr=1.0, lr_schedule="step")
    assert [lr_at(step, s, 10, 100, 1) for s in (0, 49, 50, 75)] == pytest.approx([1, 1, 0.1, 0.01])
    cosine = Config(lr=1.0, lr_schedule="cosine")
    assert lr_at(cosine, 50, 10, 100, 1) == pytest.approx(0.5)
