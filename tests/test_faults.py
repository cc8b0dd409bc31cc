"""Faults end the whole job cleanly: signals to the launcher, a rank killed, a rank raising."""

from __future__ import annotations

import json
import re
import signal
import time

import psutil
import pytest

from datasets import write_imagefolder
from launch import command
from processes import Job, assert_nothing_left, worker

LONG = ["--model", "mlp", "--epochs", "400", "--threads", "1"]


@pytest.mark.parametrize("launcher,sig", [("torchrun", signal.SIGTERM), ("torchrun", signal.SIGINT),
                                          ("horovodrun-gloo", signal.SIGTERM), ("mpirun", signal.SIGTERM)])
def test_signal_to_launcher_stops_every_rank_with_a_checkpoint(tmp_path, launcher, sig):
    run_dir = tmp_path / "run"
    job = Job(command(launcher, 2, LONG + ["--run-dir", str(run_dir)]))
    job.wait_for(r"epoch 2 step")
    sent = time.monotonic()
    job.proc.send_signal(sig)
    code = job.wait(timeout=15)
    assert time.monotonic() - sent < 15
    assert code != 0
    assert_nothing_left(str(run_dir))
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stopped = [e for e in events if e["event"] == "stopped"]
    assert stopped, f"no final checkpoint:\n{job.output[-3000:]}"
    assert any(e["event"] == "checkpoint" and e["step"] == stopped[0]["step"] for e in events)
    # The run continues from there.
    from common.checkpoint import find_newest_valid
    ckpt, _, problems = find_newest_valid(str(run_dir))
    assert ckpt["step"] == stopped[0]["step"] and not problems


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-gloo", "horovodrun-mpi", "mpirun"])
def test_a_killed_rank_ends_the_job(tmp_path, launcher):
    run_dir = tmp_path / "run"
    job = Job(command(launcher, 2, LONG + ["--run-dir", str(run_dir)]))
    job.wait_for(r"epoch 2 step")
    worker(str(run_dir), 1).kill()
    killed = time.monotonic()
    code = job.wait(timeout=60)
    assert code != 0 and time.monotonic() - killed < 60
    assert_nothing_left(str(run_dir))
    assert re.search(r"(rank\s*:\s*1\b|Process name: 1\b|\[\[\d+,\d+\],1\]|rank 1 )", job.output), job.output[-3000:]
    assert not (run_dir / "summary.json").exists()


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-gloo", "mpirun"])
def test_a_rank_that_raises_ends_the_job_and_is_named(tmp_path, launcher):
    data = write_imagefolder(tmp_path / "data", classes=2, per_class=16, size=16)
    run_dir = tmp_path / "run"
    job = Job(command(launcher, 2, ["--dataset", "imagefolder", "--data-dir", str(data), "--image-size", "16",
                            "--model", "mlp", "--batch-size", "2", "--epochs", "400", "--threads", "1",
                            "--run-dir", str(run_dir)]))
    job.wait_for(r"epoch 2 step")
    victim = sorted((data / "train").rglob("*.png"))[0]
    victim.write_bytes(b"not a png any more")  # unreadable mid-run: the rank that reads it raises
    code = job.wait(timeout=60)
    assert code != 0
    assert_nothing_left(str(run_dir))
    failed = re.search(r"\[rank (\d)\] hvd_train: error: rank (\d) failed|\[rank (\d)\] ddp_train: error: rank (\d) failed",
                       job.output)
    assert failed, job.output[-3000:]
    assert "UnidentifiedImageError" in job.output or "cannot identify image" in job.output


def test_torchrun_restart_resumes_and_ends_bitwise_equal(tmp_path):
    """torchrun --max-restarts 1 with --resume auto: a rank killed once costs only a restart."""
    from launch import BIN, launch, read_run as read
    args = ["--model", "mlp", "--epochs", "4", "--threads", "1", "--checkpoint-every", "5", "--resume", "auto"]
    undisturbed = tmp_path / "undisturbed"
    launch("torchrun", 2, args + ["--run-dir", str(undisturbed)]).check()

    run_dir = tmp_path / "restarted"
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", "--max-restarts=1",
           "-m", "ddp_train", *args, "--run-dir", str(run_dir)]
    job = Job(cmd)
    job.wait_for(r"epoch 2 step")
    worker(str(run_dir), 1).kill()
    assert job.wait(timeout=120) == 0, job.output[-3000:]
    assert "resuming from" in job.output
    assert read(run_dir)["summary"]["weights_sha256"] == read(undisturbed)["summary"]["weights_sha256"]
    assert_nothing_left(str(run_dir))


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-gloo", "mpirun"])
def test_a_stuck_rank_is_reported_within_the_timeout(tmp_path, launcher):
    run_dir = tmp_path / "run"
    job = Job(command(launcher, 2, LONG + ["--timeout", "10", "--run-dir", str(run_dir)]))
    job.wait_for(r"epoch 2 step")
    stuck = worker(str(run_dir), 1)
    stuck.send_signal(signal.SIGSTOP)  # alive, holding its connections, taking no part
    started = time.monotonic()
    try:
        code = job.wait(timeout=90)
    finally:
        try:
            stuck.kill()
        except psutil.NoSuchProcess:
            pass
    assert code != 0
    assert_nothing_left(str(run_dir))
    if launcher == "torchrun":
        # DDP names the rank: the live ranks check in at the store, the stuck one cannot.
        assert "[rank 0] ddp_train: error: rank 1 stopped taking part" in job.output, job.output[-3000:]
    elif launcher == "mpirun":
        # An MPI wait has no timeout of its own: the progress watchdog ends it after --timeout + grace.
        assert "[rank 0] hvd_train: error: no progress for" in job.output, job.output[-3000:]
    else:
        # Horovod's Gloo controller times out by itself (HOROVOD_GLOO_TIMEOUT_SECONDS from --timeout).
        assert "[rank 0] hvd_train: error:" in job.output, job.output[-3000:]
    assert time.monotonic() - started < 60
