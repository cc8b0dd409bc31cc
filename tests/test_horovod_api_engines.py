"""horovod.spark.run and horovod.ray.RayExecutor on the Horovod API, on a real local Spark (`local[2]`) and a real local
Ray (`ray.init(num_cpus=2)`): drivers in Horovod's documented style, unchanged, under `python -m ddp_train.horovod_api`,
and their ports (python -m ddp_train.port: TorchDistributor, Ray actors) under plain python with Horovod not importable.

Every rank's result comes back in rank order, and rank 0's weights are bitwise equal to the same function's under
`horovodrun -np 2 --gloo` with real Horovod; an exception in one worker is the driver's exception, naming the rank,
with no worker left; too many workers for the cluster is one line naming both numbers; the driver's Ctrl-C leaves no
worker running."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

import engine_drivers
from engine_drivers import ENGINE_ENV, alive, check_failure, results
from ddp_train.port.__main__ import main as port_main
from launched import PY, run_cmd
from processes import Job
from projects import block_horovod

pytestmark = pytest.mark.timeout(900)

@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("engines")
    engine_drivers.write(where)
    for name in ("spark_pids", "ray_pids", "spark_hang", "ray_hang"):
        (where / name).mkdir()
    return where


def interrupted(folder: Path, args: List[str], hang_dir: Path) -> Dict[str, Any]:
    """A driver's checks, then its Ctrl-C (SIGINT) once both workers sleep in fn: its results, its exit code, and
    the workers left running 10 s after it ended."""
    job = Job([PY, "-m", "ddp_train.horovod_api", *args, str(hang_dir)], env=ENGINE_ENV, cwd=folder)
    job.wait_until(lambda: len(list(hang_dir.iterdir())) == 2, "the workers never reached fn", timeout=600)
    job.send_signal(signal.SIGINT)
    code = job.wait(timeout=60)
    deadline = time.monotonic() + 10
    while alive(hang_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    return {**results(job.output), "exit": code, "left": alive(hang_dir)}


@pytest.fixture(scope="module")
def under_horovodrun(folder, runs) -> Dict[str, Any]:
    """Rank 0's result of the same train() under horovodrun -np 2 --gloo, real Horovod."""
    return engine_drivers.horovodrun_reference(runs, folder)


@pytest.fixture(scope="module")
def spark(folder) -> Dict[str, Any]:
    return interrupted(folder, ["spark_driver.py", "local[2]", "2", str(folder / "spark_pids")],
                       folder / "spark_hang")


@pytest.fixture(scope="module")
def ray(folder) -> Dict[str, Any]:
    return interrupted(folder, ["ray_driver.py", str(folder / "ray_pids")], folder / "ray_hang")


@pytest.fixture(scope="module")
def ported(folder) -> Dict[str, Any]:
    """The two drivers ported, each run with Horovod not importable: Spark's train only, Ray's every check."""
    blocked = block_horovod(folder / "blocked")
    env = {**ENGINE_ENV, "PYTHONPATH": str(blocked)}
    found: Dict[str, Any] = {}
    for name in ("spark", "ray"):
        assert port_main([str(folder / f"{name}_driver.py"), "-o", str(folder / f"{name}_port.py")]) == 0
        (folder / f"{name}_port_pids").mkdir()
    found["spark_source"] = (folder / "spark_port.py").read_text()
    out = run_cmd([PY, "spark_port.py", "local[2]", "2"], cwd=folder, env=env, timeout=600).check()
    found["spark"] = results(out.output)
    out = run_cmd([PY, "ray_port.py", str(folder / "ray_port_pids")], cwd=folder, env=env, timeout=600).check()
    found["ray"] = results(out.output)
    return found


def check_train(found: Dict[str, Any], reference: Dict[str, Any]) -> None:
    train = found["train"]
    assert [r["rank"] for r in train] == [0, 1] and all(r["size"] == 2 for r in train)
    assert train[0]["sha256"] == reference["sha256"], "rank 0's weights differ from horovodrun's"
    assert train[1]["sha256"] == train[0]["sha256"]


def test_spark_run_returns_every_rank_in_order_bitwise_equal_to_horovodrun(spark, under_horovodrun):
    check_train(spark, under_horovodrun)


def test_spark_worker_exception_names_the_rank_and_leaves_no_worker(spark, folder):
    check_failure(spark, folder / "spark_pids", "horovod.spark.run")


def test_spark_refusals_are_one_line(spark):
    assert spark["too_many"] == ("horovod.spark.run: num_proc=3 is more than the 2 task slots of this Spark cluster; "
                                 "each Horovod process runs in a Spark task: lower num_proc or give Spark more cores "
                                 "(local[N], or more executors)")


def test_ctrl_c_in_the_spark_driver_leaves_no_worker(spark):
    assert spark["exit"] != 0 and spark["left"] == []


def test_spark_run_without_a_session_gives_horovods_message(folder):
    out = run_cmd([PY, "-m", "ddp_train.horovod_api", "no_session_driver.py"], cwd=folder, env=ENGINE_ENV).check()
    assert ("RESULT Exception: Could not find an active SparkContext, are you running in a PySpark session?"
            in out.output)


def test_ray_executor_run_returns_every_rank_in_order_bitwise_equal_to_horovodrun(ray, under_horovodrun):
    check_train(ray, under_horovodrun)


def test_ray_workers_keep_their_state_across_calls(ray):
    assert ray["count"] == [[1, 1], [2, 2], 3]
    pids = ray["remote"]
    assert len(pids) == 2 and len(set(pids)) == 2 and os.getpid() not in pids


def test_ray_worker_exception_names_the_rank_and_ends_every_worker(ray, folder):
    check_failure(ray, folder / "ray_pids", "RayExecutor")
    assert ray["after_fail"] == 0


def test_ctrl_c_in_the_ray_driver_leaves_no_worker(ray):
    assert ray["exit"] != 0 and ray["left"] == []


def test_ray_too_many_workers_is_one_line(ray):
    assert ray["too_many"] == ("RayExecutor: 3 workers need 3 CPU, the Ray cluster has 2 CPU (not placed within "
                               "placement_group_timeout_s=2 s): lower num_workers or cpus_per_worker, or add nodes")


def test_the_ports_run_without_horovod_bitwise_equal_to_horovodrun(ported, under_horovodrun):
    assert "horovod" not in ported["spark_source"].split("def train", 1)[1].split("def report", 1)[0]
    check_train(ported["spark"], under_horovodrun)
    check_train(ported["ray"], under_horovodrun)
    assert ported["ray"]["count"] == [[1, 1], [2, 2], 3]


def test_the_ported_ray_executor_names_the_failing_rank_and_ends_every_worker(ported, folder):
    fail = ported["ray"]["fail"]
    assert fail["type"] == "RuntimeError"
    assert fail["message"] == "RayExecutor: rank 1 raised ValueError: rank 1 cannot train"
    assert alive(folder / "ray_port_pids") == []
    assert ported["ray"]["after_fail"] == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
