"""`horovod.spark.run` on PySpark's TorchDistributor: Horovod's call on an active SparkSession, each rank running the
function on the API (horovod/spark/runner.py is what it keeps the meaning of).

- The ranks start through TorchDistributor: where Spark's master is local (`local[N]`), in local mode (torchrun on the
  driver's host); on a cluster, as barrier tasks, one rank a task.
- The call returns every rank's return value in rank order, as Horovod's does (TorchDistributor itself gives back one
  process's): each rank reports its own to the driver (collector.py, spark_task.py).
- `num_proc=None` is Spark's default parallelism, as in Horovod. More ranks than the cluster's task slots, still so
  after `start_timeout`, is refused in one line naming both numbers (Horovod waits that long for its tasks too).
- An exception on a rank is the exception of the call (outcomes.WorkerError, naming the rank and its message);
  torchrun stops the other ranks.
- `run_elastic` is refused in one line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from . import visible
from .collector import Collector
from .outcomes import in_rank_order
from .spark_task import TaskSpec, run_rank

WHERE = "horovod.spark.run"
#: Horovod's own words when there is no SparkContext (horovod/spark/runner.py)
NO_SPARK_CONTEXT = "Could not find an active SparkContext, are you running in a PySpark session?"
ELASTIC_REFUSED = ("horovod.spark.run_elastic is not offered by the Horovod API on torch.distributed: call "
                   "horovod.spark.run(fn, num_proc=N) (a fixed number of ranks), or resume from a checkpoint in fn")
#: seconds between two looks at the cluster's task slots while more are needed
SLOTS_POLL_S = 0.5

log = logging.getLogger("horovod.spark")


def _start_timeout(start_timeout: Optional[float]) -> float:
    if start_timeout is not None:
        return float(start_timeout)
    raw = os.environ.get("HOROVOD_SPARK_START_TIMEOUT", "600")
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"HOROVOD_SPARK_START_TIMEOUT={raw!r} is not a number of seconds: set it to one, "
                         "e.g. 600") from None


def is_local_master(master: str) -> bool:
    """Whether Spark's master runs every task in the driver's process (`local`, `local[N]`, `local[*]`)."""
    return master == "local" or master.startswith("local[")


def task_slots(spark_context: Any) -> int:
    """How many tasks the cluster can run at once now (what a barrier stage needs one each of): Spark's own count
    for its default resource profile, else its default parallelism."""
    try:
        jsc = spark_context._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # Spark Connect, or an internal that moved: the public figure
        return int(spark_context.defaultParallelism)


def wait_for_slots(spark_context: Any, num_proc: int, timeout_s: float, local: bool) -> None:
    """Return once the cluster has `num_proc` task slots; a ValueError naming both numbers if it has not within
    `timeout_s` (at once where the master is local: its slots are fixed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        slots = task_slots(spark_context)
        if num_proc <= slots:
            return
        if local or time.monotonic() >= deadline:
            waited = "" if local else f" after waiting start_timeout={timeout_s:g} s"
            raise ValueError(f"{WHERE}: num_proc={num_proc} is more than the {slots} task slots of this Spark "
                             f"cluster{waited}; each Horovod process runs in a Spark task: lower num_proc or give "
                             "Spark more cores (local[N], or more executors)")
        time.sleep(SLOTS_POLL_S)


def _uses_gpus(conf: Any, local: bool) -> bool:
    """TorchDistributor's use_gpu: where Spark was given GPUs (the driver's in local mode, the tasks' on a cluster)."""
    key = "spark.driver.resource.gpu.amount" if local else "spark.task.resource.gpu.amount"
    try:
        return float(conf.get(key, "0") or 0) > 0
    except ValueError:
        return False


def _report_host(conf: Any, local: bool) -> str:
    """The driver's address as the ranks reach it."""
    return "127.0.0.1" if local else str(conf.get("spark.driver.host", "127.0.0.1"))


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None,
        num_proc: Optional[int] = None, start_timeout: Optional[float] = None, use_mpi: Optional[bool] = None,
        use_gloo: Optional[bool] = None, extra_mpi_args: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None, stdout: Any = None, stderr: Any = None, verbose: int = 1,
        nics: Any = None, prefix_output_with_timestamp: bool = False,
        executable: Optional[str] = None) -> List[Any]:
    """Horovod's `horovod.spark.run`: `num_proc` ranks each run `fn(*args, **kwargs)` on the API; the list of their
    return values in rank order. The collectives run on torch.distributed whatever `use_mpi`/`use_gloo` say; `nics`,
    `extra_mpi_args`, `executable` and `prefix_output_with_timestamp` have no effect here (the ranks run the driver's
    Python through TorchDistributor's torchrun). The ranks' output, stderr merged into stdout as TorchDistributor
    forwards it in local mode, goes to `stdout` where one is given."""
    from pyspark import SparkContext, cloudpickle
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    timeout_s = _start_timeout(start_timeout)
    spark_context = SparkContext._active_spark_context
    if spark_context is None:
        raise Exception(NO_SPARK_CONTEXT)
    if num_proc is None:
        num_proc = int(spark_context.defaultParallelism)
        if verbose >= 1:
            log.info("Running %d processes (inferred from spark.default.parallelism)...", num_proc)
    elif verbose >= 1:
        log.info("Running %d processes...", num_proc)
    if not isinstance(num_proc, int) or isinstance(num_proc, bool) or num_proc < 1:
        raise ValueError(f"{WHERE}: num_proc={num_proc!r} is not a positive number of processes: pass num_proc=N "
                         "(N >= 1), or leave it out for Spark's default parallelism")
    conf = spark_context.getConf()
    local = is_local_master(str(conf.get("spark.master", "")))
    wait_for_slots(spark_context, num_proc, timeout_s, local)
    SparkSession.builder.getOrCreate()  # TorchDistributor reads the active session
    with visible.shown():
        function = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    group = f"horovod.spark.run.{uuid.uuid4().hex[:12]}"
    # On a cluster a failed barrier stage is retried by Spark (spark.task.maxFailures): the first rank's error ends the
    # job instead, as Horovod's driver cancels its Spark job. In local mode torchrun stops the other ranks itself.
    cancel = None if local else (lambda: spark_context.cancelJobGroup(group))
    with Collector(_report_host(conf, local), on_error=cancel) as collector:
        spec = TaskSpec(function, collector.address, {str(k): str(v) for k, v in (env or {}).items()})
        distributor = TorchDistributor(num_processes=num_proc, local_mode=local, use_gpu=_uses_gpus(conf, local))
        redirect = contextlib.redirect_stdout(stdout) if stdout is not None else contextlib.nullcontext()
        failure: Optional[BaseException] = None
        try:
            with redirect:
                if not local:
                    spark_context.setJobGroup(group, WHERE, interruptOnCancel=True)
                with visible.shown():
                    distributor.run(run_rank, spec)
        except Exception as exc:  # a rank failed: its own report says which and why, if it made one
            failure = exc
        except BaseException:  # Ctrl-C: the barrier tasks stop with the job (local mode: TorchDistributor's own)
            if not local:
                spark_context.cancelJobGroup(group)
            raise
        outcomes: Dict[int, Any] = collector.by_rank()
    if failure is not None and not any(o.error is not None for o in outcomes.values()):
        raise failure
    return in_rank_order(WHERE, outcomes, num_proc)


def run_elastic(*args: Any, **kwargs: Any) -> List[Any]:
    """Horovod's `horovod.spark.run_elastic`: refused (the API's ranks are fixed for a run)."""
    raise ValueError(ELASTIC_REFUSED)
