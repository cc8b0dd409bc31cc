"""The port of drivers that trained through Spark and Ray (no process launched): horovod.spark.run becomes the
TorchDistributor helper, horovod.ray.RayExecutor the class of Ray actors, each named in the report by its full name,
and run_elastic is left unported with its reason."""

from __future__ import annotations

import textwrap

from ddp_train.port import port

SPARK_DRIVER = """\
import horovod.spark
import horovod.torch as hvd


def train(lr):
    hvd.init()
    return hvd.rank()


results = horovod.spark.run(train, args=(0.1,), num_proc=2)
"""

RAY_DRIVER = """\
import horovod.torch as hvd
from horovod.ray import RayExecutor


def train():
    hvd.init()
    return hvd.rank()


settings = RayExecutor.create_settings(timeout_s=30)
executor = RayExecutor(settings, num_workers=2)
executor.start()
results = executor.run(train)
executor.shutdown()
"""


def test_spark_run_becomes_the_torch_distributor_helper_named_by_its_full_name():
    result = port(SPARK_DRIVER, "driver.py", "driver_ddp.py")
    assert "results = horovod_spark_run(train, args=(0.1,), num_proc=2)" in result.code
    assert "def horovod_spark_run(" in result.code and "TorchDistributor" in result.code
    assert "horovod" not in result.code.replace("horovod_spark_run", "").replace("horovod.spark.run", "")
    rules = {c.rule for c in result.report.changes}
    assert "horovod.spark.run" in rules and not any(r.startswith("hvd.horovod") for r in rules)
    assert "rank order" in next(c.text for c in result.report.changes if c.rule == "horovod.spark.run")


def test_ray_executor_becomes_the_class_of_ray_actors_with_the_same_calls():
    result = port(RAY_DRIVER, "driver.py", "driver_ddp.py")
    assert "settings = RayActorExecutor.create_settings(timeout_s=30)" in result.code
    assert "executor = RayActorExecutor(settings, num_workers=2)" in result.code
    assert "class RayActorExecutor" in result.code and "import horovod" not in result.code
    rules = {c.rule for c in result.report.changes}
    assert "horovod.ray.RayExecutor" in rules and not any(r.startswith("hvd.horovod") for r in rules)


def test_run_elastic_is_left_unported_with_its_reason():
    source = SPARK_DRIVER.replace("horovod.spark.run(train", "horovod.spark.run_elastic(train")
    result = port(source, "driver.py", "driver_ddp.py")
    assert "horovod.spark.run_elastic(train" in result.code
    assert any("run_elastic" in u.code for u in result.report.unported), textwrap.indent(str(result.report), "  ")
