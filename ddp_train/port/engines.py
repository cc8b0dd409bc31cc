"""The port of a driver that trains through Spark or Ray: `horovod.spark.run(...)` becomes PySpark's TorchDistributor,
`horovod.ray.RayExecutor` a class of Ray actors that keeps its meaning, each written into the script as a helper.

- horovod.spark.run: TorchDistributor in local mode where Spark's master is local, as barrier tasks on a cluster;
  every rank's return value in rank order, as Horovod returned them (TorchDistributor returns one process's, so each
  rank gathers them all with dist.all_gather_object after the function). What differs, said at the line: a rank's
  exception reaches the driver as TorchDistributor's RuntimeError with the workers' last lines of output.
- RayExecutor: the same calls (create_settings, start, run, execute, execute_single, run_remote, shutdown) on Ray
  actors that keep their process, so their state and their process group, across calls; the function's own
  dist.init_process_group() joins the group (each actor's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set at start).
"""

from __future__ import annotations

from typing import Dict, Optional

import libcst as cst

from .context import Context, code
from .helpers import Helper
from libcst.metadata import Scope
from .rule import Expression

SPARK_RUN = "horovod.spark.run"
RAY_EXECUTOR = "horovod.ray.RayExecutor"

HELPERS: Dict[str, Helper] = {
    "horovod_spark_run": Helper('''
def {name}(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, env=None, **unused):
    """horovod.spark.run on PySpark's TorchDistributor: num_proc processes (Spark's default parallelism if None)
    run fn(*args, **kwargs) under torchrun, in local mode where Spark's master is local, as barrier tasks on a
    cluster; every rank's return value in rank order, as Horovod returned them (each rank gathers them all:
    TorchDistributor returns one process's). A rank's exception is TorchDistributor's RuntimeError here."""
    from pyspark import SparkContext
    from pyspark.ml.torch.distributor import TorchDistributor

    spark_context = SparkContext._active_spark_context
    if spark_context is None:
        raise Exception({q}Could not find an active SparkContext, are you running in a PySpark session?{q})
    conf = spark_context.getConf()
    master = conf.get({q}spark.master{q}, {q}{q})
    local = master == {q}local{q} or master.startswith({q}local[{q})
    gpus = conf.get({q}spark.driver.resource.gpu.amount{q} if local else {q}spark.task.resource.gpu.amount{q}, {q}0{q})
    distributor = TorchDistributor(num_processes=num_proc or spark_context.defaultParallelism, local_mode=local,
                                   use_gpu=float(gpus or 0) > 0)
    return distributor.run({gathered_on_every_rank}, fn, tuple(args), dict(kwargs or {{}}), dict(env or {{}}))
''', ("gathered_on_every_rank",)),
    "gathered_on_every_rank": Helper('''
def {name}(fn, args, kwargs, env):
    """fn(*args, **kwargs) on this rank of a TorchDistributor run, then every rank's value in rank order."""
    import os

    os.environ.update({{str(key): str(value) for key, value in env.items()}})
    value = fn(*args, **kwargs)
    if not {dist}.is_initialized():
        {dist}.init_process_group({q}gloo{q})
    values = [None] * {dist}.get_world_size()
    {dist}.all_gather_object(values, value)
    return values
''', ("dist",)),
    "RayActorExecutor": Helper('''
class {name}:
    """horovod.ray.RayExecutor on Ray actors, one a rank: each keeps its process, so its state and its process
    group, across calls; a function's dist.init_process_group() there joins the group (RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT are set in each actor at start()). run() and execute() return every rank's value in
    rank order; a rank's exception ends every actor (the others may wait for it in a collective) and is raised."""

    @classmethod
    def create_settings(cls, timeout_s=30, placement_group_timeout_s=100, **unused):
        return {{{q}timeout_s{q}: timeout_s, {q}placement_group_timeout_s{q}: placement_group_timeout_s}}

    def __init__(self, settings=None, num_workers=1, cpus_per_worker=1, use_gpu=False, gpus_per_worker=None,
                 **unused):
        self.settings = settings or self.create_settings()
        self.num_workers = num_workers
        self.resources = {{{q}num_cpus{q}: cpus_per_worker, {q}num_gpus{q}: (gpus_per_worker or 1) if use_gpu else 0}}
        self.workers = []

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None, extra_env_vars=None):
        import ray

        class Worker:
            executable = None

            def where(self):
                import socket

                with socket.socket() as sock:
                    sock.bind(({q}{q}, 0))
                    return ray.util.get_node_ip_address(), sock.getsockname()[1]

            def setup(self, env, cls, args, kwargs):
                import os

                os.environ.update(env)
                # every function run here may call hvd.init(), ported as {dist}.init_process_group(), as Horovod
                # allows: torch refuses a second one, so in the actors a call once the group is up does nothing
                first = {dist}.init_process_group
                {dist}.init_process_group = lambda *a, **k: None if {dist}.is_initialized() else first(*a, **k)
                if cls is not None:
                    self.executable = cls(*args, **kwargs)

            def execute(self, fn):
                return fn(self.executable)

            def call(self, fn, args, kwargs):
                return fn(*args, **kwargs)

        if not ray.is_initialized():
            ray.init()
        self.workers = [ray.remote(Worker).options(**self.resources).remote() for _ in range(self.num_workers)]
        wait_s = self.settings[{q}placement_group_timeout_s{q}]
        ready, _ = ray.wait([w.where.remote() for w in self.workers], num_returns=self.num_workers, timeout=wait_s)
        if len(ready) < self.num_workers:
            self.shutdown()
            raise TimeoutError(f{q}RayExecutor: {{self.num_workers}} workers of {{self.resources}} did not start {q}
                               f{q}within {{wait_s}} s: the Ray cluster has {{ray.cluster_resources()}}{q})
        places = ray.get([w.where.remote() for w in self.workers])
        nodes = [address for address, _ in places]
        for rank, worker in enumerate(self.workers):
            env = dict(extra_env_vars or {{}}, RANK=str(rank), WORLD_SIZE=str(self.num_workers),
                       LOCAL_RANK=str(nodes[:rank].count(nodes[rank])), LOCAL_WORLD_SIZE=str(nodes.count(nodes[rank])),
                       MASTER_ADDR=places[0][0], MASTER_PORT=str(places[0][1]))
            worker.setup.remote(env, executable_cls, executable_args or [], executable_kwargs or {{}})

    def _gather(self, refs):
        import ray

        values, pending = [None] * len(refs), list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            rank = refs.index(ready[0])
            try:
                values[rank] = ray.get(ready[0])
            except Exception as exc:
                self.shutdown()
                cause = getattr(exc, {q}cause{q}, None) or exc
                message = f{q}rank {{rank}} raised {{type(cause).__name__}}: {{cause}}{q}
                raise RuntimeError(f{q}RayExecutor: {{message}}{q}) from exc
        return values

    def run(self, fn, args=None, kwargs=None, callbacks=None):
        return self._gather(self.run_remote(fn, args, kwargs))

    def run_remote(self, fn, args=None, kwargs=None):
        return [w.call.remote(fn, list(args or []), dict(kwargs or {{}})) for w in self.workers]

    def execute(self, fn, callbacks=None):
        return self._gather([w.execute.remote(fn) for w in self.workers])

    def execute_single(self, fn):
        return self._gather([self.workers[0].execute.remote(fn)])[0]

    def shutdown(self):
        import ray

        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
''', ("dist",)),
}

SPARK_DOES = ("PySpark's TorchDistributor (local mode where Spark's master is local, barrier tasks on a cluster), "
              "every rank's return value in rank order as horovod.spark.run returned them (each rank gathers them "
              "with dist.all_gather_object: TorchDistributor itself returns one process's); differs: a rank's "
              "exception reaches the driver as TorchDistributor's RuntimeError with the workers' last lines of "
              "output, not as the rank's own exception")
RAY_DOES = ("Ray actors, one a rank, that keep their process (their state and process group) across calls, as "
            "RayExecutor's did; the function's dist.init_process_group() joins the group (RANK, WORLD_SIZE, "
            "MASTER_ADDR, MASTER_PORT set in each actor at start()), and a later call's once the group is up does "
            "nothing, as hvd.init() did; a rank's exception ends every actor and is raised naming the rank")


def spark_run(ctx: Context, api: str, call: cst.Call, scope: Optional[Scope]) -> Optional[Expression]:
    """horovod.spark.run(fn, ...) -> horovod_spark_run(fn, ...), a helper on TorchDistributor with Horovod's
    arguments."""
    helper = ctx.helper("horovod_spark_run")
    return Expression(code(call.with_changes(func=cst.Name(helper))), SPARK_DOES)


def constant(ctx: Context, api: str) -> Optional[Expression]:
    """horovod.ray.RayExecutor as a name: the helper class of Ray actors."""
    if api == RAY_EXECUTOR:
        return Expression(ctx.helper("RayActorExecutor"), RAY_DOES)
    return None
