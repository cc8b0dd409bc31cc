"""The sbatch templates in slurm/, each submitted with `sbatch --wait` on node0 to the Slurm cluster of the two
simulated hosts (tests/slurm_cluster.py), one task (or one torchrun) on each node: every run directory complete,
what the templates read from Slurm's variables right (the job's id, its nodes, the first node as the rendezvous),
and DDP and Horovod bitwise equal at 2 ranks."""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from cluster import on_host
from launched import REPO, read_run
from processes import Job
from slurm_cluster import submitted_job
from common.rundir.names import CONFIG_FILE, METRICS_FILE, MODEL_FILE, SUMMARY_FILE

pytestmark = pytest.mark.multinode

#: template -> the launcher its runs record
TEMPLATES = {"ddp_torchrun.sbatch": "torchrun", "ddp_srun.sbatch": "srun", "hvd_srun.sbatch": "srun"}
#: over the templates' #SBATCH lines: one task on each of the 2 nodes (torchrun's one worker: no GPUs here), one
#: CPU each (a host has 2 slots), so that two of the three jobs run at once
SBATCH = ["sbatch", "--wait", "--nodes", "2", "--ntasks-per-node", "1", "--cpus-per-task", "1"]
ARGS = ["--model", "mlp", "--dataset", "synthetic", "--max-steps", "6", "--threads", "1"]
#: the rendezvous port of the DDP templates' jobs on node0 (they run at the same time)
PORTS = {"ddp_torchrun.sbatch": "29601", "ddp_srun.sbatch": "29602"}
#: the template submitted without RUN_DIR: it writes runs/slurm-<job id> in the submit directory
DEFAULT_RUN_DIR = "hvd_srun.sbatch"
DOC = REPO / "docs" / "multinode-and-slurm.md"


@dataclass
class Submitted:
    """One template's job: the command as run on node0, what sbatch returned, the job's id, output and run dir."""

    cmd: List[str]
    env: Dict[str, str]
    returncode: int
    seconds: float
    job: str
    output: str
    run_dir: Path


def documented(submitted: Submitted, folder: Path) -> str:
    """The command as docs/multinode-and-slurm.md gives it: paths in the test's folder are under runs/ there."""
    line = " ".join([*(f"{k}={v}" for k, v in submitted.env.items()), *map(shlex.quote, submitted.cmd)])
    return line.replace(f"{folder}/", "runs/")


@pytest.fixture(scope="module")
def submitted(slurm, tmp_path_factory):
    """The three templates submitted together (two run at once, the third when a slot frees): template ->
    Submitted."""
    slurm.wait_until_idle()
    folder = tmp_path_factory.mktemp("sbatch")
    jobs = {}
    for template in TEMPLATES:
        stem = template.split(".")[0]
        env = {} if template == DEFAULT_RUN_DIR else {"RUN_DIR": str(folder / stem)}
        if template in PORTS:
            env["MASTER_PORT"] = PORTS[template]
        cmd = [*SBATCH, "--output", f"{folder}/{stem}-%j.out", f"slurm/{template}", *ARGS]
        jobs[template] = (cmd, env, Job(on_host("node0", cmd), env=env))
    found = {}
    try:
        for template, (cmd, env, job) in jobs.items():
            code = job.wait(timeout=240)
            number = submitted_job(job.output)
            output = folder / f"{template.split('.')[0]}-{number}.out"
            run_dir = Path(env["RUN_DIR"]) if "RUN_DIR" in env else REPO / "runs" / f"slurm-{number}"
            found[template] = Submitted(cmd, env, code, job.seconds, number,
                                        output.read_text() if output.exists() else job.output, run_dir)
    finally:
        for _, _, job in jobs.values():
            job.stop()
    yield found, folder
    for run in found.values():
        if run.run_dir.parent == REPO / "runs":
            shutil.rmtree(run.run_dir, ignore_errors=True)


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_trains_one_rank_on_each_node(submitted, template):
    run = submitted[0][template]
    assert run.returncode == 0, f"{' '.join(run.cmd)} exited {run.returncode}:\n{run.output[-3000:]}"
    for name in (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, MODEL_FILE):
        assert (run.run_dir / name).exists(), f"{template}: no {name} in {run.run_dir}"
    files = read_run(run.run_dir)
    config, summary = files["config"], files["summary"]
    assert config["world_size"] == summary["world_size"] == 2 and summary["steps"] == 6
    assert config["hosts"] == ["node0", "node1"] and config["rank_hosts"] == ["node0", "node1"]
    assert config["launcher"] == TEMPLATES[template]
    backend = "horovod" if template.startswith("hvd") else "ddp"
    for rank, host in enumerate(("node0", "node1")):
        assert f"[{backend}] rank {rank}/2 local_rank 0/1 host {host} " in run.output, run.output[-3000:]
    if backend == "horovod":  # srun --mpi=pmix wired Open MPI up: Horovod's MPI controller saw both ranks
        assert config["backend"]["controller"] == "mpi"


def test_run_dir_defaults_to_the_job_id_in_the_submit_directory(submitted):
    run = submitted[0][DEFAULT_RUN_DIR]
    assert run.returncode == 0, run.output[-3000:]
    assert run.run_dir == REPO / "runs" / f"slurm-{run.job}" and (run.run_dir / SUMMARY_FILE).exists()


def test_ddp_and_horovod_templates_end_bitwise_equal_at_two_ranks(submitted):
    models = {template: read_run(run.run_dir)["model"] for template, run in submitted[0].items()}
    reference = models.pop("ddp_srun.sbatch")
    for template, model in models.items():
        assert model.keys() == reference.keys()
        assert all(torch.equal(model[k], reference[k]) for k in reference), f"{template} differs from ddp_srun"


def test_the_docs_give_each_command_as_run(submitted):
    runs, folder = submitted
    text = DOC.read_text()
    for run in runs.values():
        line = documented(run, folder)
        assert f"node0$ {line}\n" in text, f"docs/multinode-and-slurm.md should give `node0$ {line}`"
