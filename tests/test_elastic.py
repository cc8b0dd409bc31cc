"""Horovod elastic: a worker lost mid-run costs a restart from the last commit, not the job.

Two host names that both resolve to this machine (localhost and 127.0.0.1) stand for two hosts, so
that the elastic driver can blacklist the one whose worker failed and go on with the other.
"""

from __future__ import annotations

import json
import time

from launched import BIN, PY, launch, read_run
from processes import Job, assert_nothing_left, steps_logged, worker
from common.rundir.names import CONFIG_FILE

ARGS = ["--model", "mlp", "--epochs", "8", "--threads", "1", "--checkpoint-every", "10"]
STEPS_PER_EPOCH_2 = 23  # digits, batch 32, world size 2


def elastic_job(tmp_path, args):
    """horovodrun's elastic driver over two one-slot "hosts"; (the job, its run directory)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    run_dir = tmp_path / "elastic"
    job = Job([str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
               "--host-discovery-script", str(discover), PY, "-m", "hvd_train", *args, "--run-dir", str(run_dir)])
    return job, run_dir


def test_elastic_job_loses_a_worker_and_finishes_from_the_last_commit(tmp_path):
    job, run_dir = elastic_job(tmp_path, ARGS)
    # Kill once a step after the end of the second epoch is logged: rank 0, which goes on, has passed the
    # barrier that follows that checkpoint's file and committed it (the file alone is not yet a commit).
    job.wait_until(lambda: any(e["step"] > 2 * STEPS_PER_EPOCH_2 for e in steps_logged(run_dir)),
                   f"never logged step {2 * STEPS_PER_EPOCH_2 + 1}")
    worker(str(run_dir), 1).kill()  # its host is blacklisted by the driver; the job goes on without it
    killed = time.monotonic()
    assert job.wait(timeout=240) == 0, job.output[-4000:]
    assert time.monotonic() - killed < 240
    assert_nothing_left(str(run_dir))

    run = read_run(run_dir)
    assert run["summary"]["world_size"] == 1
    notes = [e["message"] for e in run["events"] if e["event"] == "note"]
    changed = [n for n in notes if n.startswith("world size changed 2 -> 1 at the start of epoch ")]
    assert changed and any("elastic: 1 ranks continue from the elastic commit" in n for n in notes), notes
    epoch = int(changed[0].split("at the start of epoch ")[1].split(":")[0]) - 1  # 0-based epoch it resumed at
    assert epoch >= 2
    # Every step appears once in metrics.jsonl: the steps after the commit were redone, not repeated.
    steps = [e["step"] for e in run["events"] if e["event"] == "step"]
    assert steps == sorted(set(steps)) and steps[0] == 1

    # Exactly what a checkpoint resume at that epoch boundary on one worker gives.
    reference = tmp_path / "reference"
    launch("horovodrun-gloo", 2, ARGS + ["--max-steps", str(epoch * STEPS_PER_EPOCH_2),
                                         "--run-dir", str(reference)]).check()
    launch("none-hvd", 1, ARGS + ["--resume", "auto", "--run-dir", str(reference)]).check()
    assert run["summary"]["weights_sha256"] == read_run(reference)["summary"]["weights_sha256"]
    assert json.loads((run_dir / CONFIG_FILE).read_text())["backend"]["elastic"] is True


def test_elastic_exact_job_continues_mid_epoch_at_another_world_size(tmp_path):
    """Under --reduction exact nothing depends on the world size: after a worker is lost the job goes on
    from the newest commit, mid-epoch, and ends with the bits of an undisturbed run."""
    # Steps of tens of ms (a 64x64 input), 10 a epoch (960 samples, global batch 96), a commit every 3:
    # the worker dies a step or two after the mid-epoch commit at step 12, long before the next at 15.
    exact = ["--model", "mlp", "--dataset", "synthetic", "--image-size", "64", "--synthetic-samples", "960",
             "--reduction", "exact", "--epochs", "3", "--checkpoint-every", "3"]
    job, run_dir = elastic_job(tmp_path, exact)
    mid_epoch = run_dir / "checkpoints" / f"ckpt-{12:09d}.pt"
    job.wait_until(mid_epoch.exists, f"never wrote {mid_epoch.name}")
    worker(str(run_dir), 1).kill()
    assert job.wait(timeout=240) == 0, job.output[-4000:]
    assert_nothing_left(str(run_dir))

    run = read_run(run_dir)
    assert run["summary"]["world_size"] == 1
    notes = [e["message"] for e in run["events"] if e["event"] == "note"]
    assert any(n.startswith("elastic: 1 ranks continue from the elastic commit") and "(mid-epoch)" in n
               for n in notes), notes
    reference = tmp_path / "reference"
    launch("none-hvd", 1, exact + ["--run-dir", str(reference)]).check()
    assert run["summary"]["weights_sha256"] == read_run(reference)["summary"]["weights_sha256"]
