"""Drivers in Horovod's documented style for Spark (`horovod.spark.run`) and Ray (`horovod.ray.RayExecutor`), written
into a test's folder, and the script that runs the same training function under horovodrun with real Horovod.

`train` trains a small linear model a few SGD steps with Horovod's DistributedOptimizer and returns its rank and a
SHA-256 of its weights; the same text is in both drivers. Each driver prints one `RESULT <json>` line per check."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import psutil

REPO = Path(__file__).resolve().parents[1]
#: the drivers' environment: Spark's workers run this Python; Ray's raylet waits this long for its agents (a loaded
#: 2-core machine can take longer than Ray's 30 s default)
ENGINE_ENV = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
              "RAY_agent_register_timeout_ms": "180000", "PYTHONPATH": str(REPO)}

TRAIN = '''
def train(steps):
    import hashlib
    import socket

    import torch
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data = torch.Generator().manual_seed(1 + hvd.rank())
    for _ in range(steps):
        x = torch.randn(8, 4, generator=data)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    return {"rank": hvd.rank(), "size": hvd.size(), "sha256": hashlib.sha256(weights).hexdigest(),
            "host": socket.gethostname()}


def fail(pid_dir):
    import os
    import time

    import torch
    import horovod.torch as hvd

    hvd.init()
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    if hvd.rank() == 1:
        time.sleep(1)
        raise ValueError("rank 1 cannot train")
    hvd.allreduce(torch.ones(1), name="waits_for_rank_1")
    return hvd.rank()


def hang(pid_dir):
    import os
    import time

    import horovod.torch as hvd

    hvd.init()
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    time.sleep(600)
'''

SPARK_DRIVER = TRAIN + '''

def report(name, value):
    import json

    print("RESULT " + json.dumps({"check": name, "value": value}), flush=True)


if __name__ == "__main__":
    import sys

    from pyspark.sql import SparkSession

    import horovod.spark

    spark = SparkSession.builder.master(sys.argv[1]).appName("horovod").getOrCreate()
    report("train", horovod.spark.run(train, args=(3,), num_proc=int(sys.argv[2])))
    if len(sys.argv) > 3:  # the faults too
        try:
            horovod.spark.run(fail, args=(sys.argv[3],))  # num_proc: Spark's default parallelism
        except Exception as exc:
            report("fail", {"type": type(exc).__name__, "message": str(exc), "rank": getattr(exc, "rank", None)})
        try:
            horovod.spark.run(train, args=(1,), num_proc=3, start_timeout=2)
        except Exception as exc:
            report("too_many", str(exc))
    if len(sys.argv) > 4:  # then the test's Ctrl-C, while every rank sleeps in fn
        horovod.spark.run(hang, args=(sys.argv[4],), num_proc=2)
    spark.stop()
'''

NO_SESSION_DRIVER = TRAIN + '''
import horovod.spark

try:
    horovod.spark.run(train, args=(1,), num_proc=2)
except Exception as exc:
    print("RESULT " + type(exc).__name__ + ": " + str(exc))
'''

RAY_DRIVER = TRAIN + '''

class Model:
    """State that stays in each worker between calls."""

    def __init__(self):
        self.calls = 0


def count(model):
    model.calls += 1
    return model.calls


def report(name, value):
    import json

    print("RESULT " + json.dumps({"check": name, "value": value}), flush=True)


if __name__ == "__main__":
    import sys

    import ray
    from horovod.ray import RayExecutor

    ray.init(num_cpus=2, include_dashboard=False)
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, num_workers=2, cpus_per_worker=1, use_gpu=False)
    executor.start(executable_cls=Model)
    report("train", executor.run(train, args=[3]))
    report("count", [executor.execute(count), executor.execute(count), executor.execute_single(count)])
    report("remote", ray.get(executor.run_remote(lambda: __import__("os").getpid())))
    try:
        executor.run(fail, args=[sys.argv[1]])
    except Exception as exc:
        report("fail", {"type": type(exc).__name__, "message": str(exc), "rank": getattr(exc, "rank", None)})
    report("after_fail", len(executor.workers))
    executor.shutdown()
    big = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=2), num_workers=3, cpus_per_worker=1)
    try:
        big.start()
    except Exception as exc:
        report("too_many", str(exc))
    if len(sys.argv) > 2:  # then the test's Ctrl-C, while every worker sleeps in fn
        executor = RayExecutor(settings, num_workers=2, cpus_per_worker=1)
        executor.start()
        executor.run(hang, args=[sys.argv[2]])
    ray.shutdown()
'''

HOROVODRUN_SCRIPT = '''
import importlib.util
import json
import sys

spec = importlib.util.spec_from_file_location("driver", sys.argv[1])
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)
result = driver.train(3)
if result["rank"] == 0:
    print("RESULT " + json.dumps(result), flush=True)
'''


def results(output: str) -> Dict[str, Any]:
    """The `RESULT {...}` lines a driver printed, by check."""
    found = {}
    for line in output.splitlines():
        if line.startswith("RESULT {"):
            record = json.loads(line[len("RESULT "):])
            found[record["check"]] = record["value"]
    return found


def write(folder: Path) -> None:
    """The drivers and the horovodrun script in `folder`."""
    (folder / "spark_driver.py").write_text(SPARK_DRIVER)
    (folder / "no_session_driver.py").write_text(NO_SESSION_DRIVER)
    (folder / "ray_driver.py").write_text(RAY_DRIVER)
    (folder / "under_horovodrun.py").write_text(HOROVODRUN_SCRIPT)


def horovodrun_reference(runs: Any, folder: Path) -> Dict[str, Any]:
    """Rank 0's result of the drivers' train() under `horovodrun -np 2 --gloo`, real Horovod: run once per session
    (the first module to ask runs it from its `folder`, where write() put the scripts; the others read it)."""
    from launched import BIN, PY

    out = runs.once("engine-reference", [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PY,
                                         str(folder / "under_horovodrun.py"), str(folder / "spark_driver.py")],
                    timeout=300).check()
    line = next(x for x in out.output.splitlines() if "RESULT {" in x)
    return json.loads(line.split("RESULT ", 1)[1])


def alive(pid_dir: Path) -> List[int]:
    """The workers that wrote their pid in `pid_dir` and still run."""
    pids = [int(p.name) for p in pid_dir.iterdir()]
    assert pids, "no worker wrote its pid"
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def check_failure(found: Dict[str, Any], pid_dir: Path, where: str) -> None:
    """The driver's `fail` check: the API's WorkerError naming rank 1 and its message, and no worker left."""
    fail = found["fail"]
    assert fail["type"] == "WorkerError" and fail["rank"] == 1, fail
    assert fail["message"] == f"{where}: rank 1 raised ValueError: rank 1 cannot train"
    assert alive(pid_dir) == []
