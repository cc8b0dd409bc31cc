"""Under Slurm (the cluster of tests/slurm_cluster.py on the two simulated hosts): ddp_train under srun without
MASTER_ADDR is one line on every rank; scancel ends every rank on both nodes before Slurm's SIGKILL and leaves no
process; a node that drops off the network fails its job, the rank left naming the missing one.
And the learning-rate schedule, which needs no launch."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

from cluster import on_host
from common.launch import runs_module
from processes import Job, assert_nothing_left, job_processes, wait_ended
from slurm_cluster import KILL_WAIT_S, SLURMD_TIMEOUT_S, SlurmCluster, submitted_job

pytestmark = pytest.mark.multinode

#: training that runs until it is stopped, logging often enough to be seen running
ENDLESS = ["--model", "mlp", "--dataset", "synthetic", "--threads", "1", "--epochs", "100000", "--log-every", "5"]
#: the ranks' own wait for a peer: well before Slurm sets a silent node DOWN (2/3 of SlurmdTimeout at the
#: earliest), so that they name the missing rank before Slurm ends the job for its lost node
RANK_TIMEOUT_S = 10
assert RANK_TIMEOUT_S + 5 < SLURMD_TIMEOUT_S * 2 / 3


@dataclass
class Training:
    """A template's job that trains until stopped, submitted with sbatch --wait in the background on node0."""

    sbatch: Job    # the sbatch command, which ends with the job
    number: str    # the job's id
    output: Path   # what the job printed (sbatch --output)
    run_dir: Path


def start_training(slurm: SlurmCluster, folder: Path, template: str, sbatch: List[str], env: Dict[str, str],
                   args: Sequence[str] = ()) -> Training:
    """Submit `template`, its ranks training until stopped."""
    folder.mkdir()
    output, run_dir = folder / "job.out", folder / "run"
    cmd = ["sbatch", "--wait", *sbatch, "--output", str(output), f"slurm/{template}", *ENDLESS, *args]
    job = Job(on_host("node0", cmd), env={"RUN_DIR": str(run_dir), **env})
    job.wait_for(r"Submitted batch job \d+", timeout=60)
    return Training(job, submitted_job(job.output), output, run_dir)


def wait_for_steps(training: Training) -> None:
    """Until rank 0 logs training steps (the job is killed and the test fails if it never does)."""
    training.sbatch.wait_until(
        lambda: training.output.exists() and re.search(r"epoch 1 step \d+", training.output.read_text()),
        "the job's ranks never logged a step", timeout=180)


def ranks(run_dir: Path) -> list:
    """The training processes of the run in `run_dir`, on whichever host (not srun or torchrun, whose command
    lines name the module too)."""
    return [p for p in job_processes(str(run_dir)) if runs_module(p, ("ddp_train",)) and p.name().startswith("python")]


#: the jobs scancel ends, both at once: DDP one task per rank, and torchrun's template (a torchrun on each node,
#: its worker in a session of its own)
CANCELLED = {"ddp_srun.sbatch": {"MASTER_PORT": "29604"}, "ddp_torchrun.sbatch": {"MASTER_PORT": "29605"}}
ONE_PER_NODE = ["--nodes", "2", "--ntasks-per-node", "1", "--cpus-per-task", "1"]


def test_scancel_ends_every_rank_on_both_nodes_and_leaves_nothing(slurm, tmp_path):
    jobs: Dict[str, Training] = {}
    slurm.wait_until_idle()
    try:
        for template, env in CANCELLED.items():
            jobs[template] = start_training(slurm, tmp_path / template.split(".")[0], template, ONE_PER_NODE, env)
        for template, job in jobs.items():
            wait_for_steps(job)
            assert len(ranks(job.run_dir)) == 2, f"{template}: {[p.cmdline() for p in ranks(job.run_dir)]}"
        running = {template: ranks(job.run_dir) for template, job in jobs.items()}
        started = time.monotonic()
        slurm.run(["scancel", *(job.number for job in jobs.values())], timeout=30).check()
        seconds = {}
        for template, procs in running.items():
            left = wait_ended(procs, timeout=KILL_WAIT_S + 20)
            seconds[template] = time.monotonic() - started
            assert not left, f"{template}: ranks still running {seconds[template]:.0f} s after scancel"
        for job in jobs.values():
            job.sbatch.wait(timeout=60)
    finally:
        for job in jobs.values():
            job.sbatch.stop()
    for template, job in jobs.items():
        # Every rank got SIGTERM from its node's slurmstepd and ended before Slurm's SIGKILL (KillWait).
        assert seconds[template] < KILL_WAIT_S, f"{template}: the ranks took {seconds[template]:.1f} s"
        printed = job.output.read_text()
        assert f"JOB {job.number} ON node0 CANCELLED" in printed, printed[-3000:]
        assert_nothing_left(str(job.run_dir))
        assert not slurm.step_daemons(job.number, within=10), f"{template}: a slurmstepd of the cancelled job is left"
    # An srun task gets that SIGTERM alone and stops as after Ctrl-C: the ranks agree and write a checkpoint.
    # (torchrun's workers also get torchrun's own, which ends them at once if it comes before they stopped:
    # docs/multinode-and-slurm.md.)
    srun = jobs["ddp_srun.sbatch"]
    stopped = re.search(r"stopped by SIGTERM at step (\d+); checkpoint written", srun.output.read_text())
    assert stopped, srun.output.read_text()[-3000:]
    assert (srun.run_dir / "checkpoints" / f"ckpt-{int(stopped[1]):09d}.pt").exists()


def test_srun_without_master_addr_is_one_line_on_every_rank(slurm, tmp_path):
    slurm.wait_until_idle()
    result = slurm.run(["srun", "--nodes", "2", "--ntasks-per-node", "1", "python", "-m", "ddp_train",
                        "--run-dir", str(tmp_path)], timeout=120)
    assert result.returncode == 2, result.output[-3000:]
    for rank in range(2):
        assert f"[rank {rank}] ddp_train: error: under srun without torchrun, export MASTER_ADDR and MASTER_PORT" \
            in result.output, result.output[-3000:]
    assert re.search(r"srun: error: node1: task 1: Exited with exit code 2", result.output), result.output[-3000:]


def test_a_node_that_drops_off_fails_the_job_naming_its_ranks(slurm, tmp_path):
    slurm.wait_until_idle()
    job = start_training(slurm, tmp_path / "dropped", "ddp_srun.sbatch", ["--no-requeue", *ONE_PER_NODE],
                         {"MASTER_PORT": "29606"}, ["--timeout", str(RANK_TIMEOUT_S)])
    cluster = slurm.cluster
    try:
        wait_for_steps(job)
        cluster.set_link("node1", up=False)  # node1, its slurmd and its rank, cut off
        cut = time.monotonic()
        code = job.sbatch.wait(timeout=RANK_TIMEOUT_S + SLURMD_TIMEOUT_S + 60)
        seconds = time.monotonic() - cut
    finally:
        cluster.set_link("node1", up=True)
        job.sbatch.stop()
    printed = job.output.read_text()
    # The job failed: a non-zero exit, or, where Slurm ended the job for its lost node before its batch script
    # exited, the job's state says so (sbatch --wait then returns the job's exit code as recorded: 0).
    state = re.search(r"JobState=(\S+)", slurm.run(["scontrol", "show", "job", job.number]).output)
    assert code != 0 or (state and state[1] in ("NODE_FAIL", "FAILED")), (state and state[1], printed[-3000:])
    # The rank on node0 names the one it lost, with its host.
    assert "[rank 0] ddp_train: error: rank 1 (node1) stopped taking part" in printed, printed[-3000:]
    # Slurm found node1 silent past SlurmdTimeout and ended the job's step, and with it the job (not requeued:
    # --no-requeue, so sbatch --wait returned).
    assert "srun: error: Node failure on node1" in printed, printed[-3000:]
    assert seconds < RANK_TIMEOUT_S + SLURMD_TIMEOUT_S + 30, f"the job ended {seconds:.0f} s after node1 dropped"
    # node1's rank, cut off from the other, leaves by itself.
    assert_nothing_left(str(job.run_dir), within=RANK_TIMEOUT_S + 30)
    slurm.wait_until_idle()  # node1 back in service for what follows


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
