"""Horovod's torch API on torch.distributed: a Horovod script runs unchanged, without Horovod.

    torchrun --nproc-per-node 2 -m ddp_train.horovod_api train_horovod.py --epochs 1
    torchrun --nproc-per-node 2 -m ddp_train.horovod_api -m pytest test_torch.py

`install()` makes `import horovod` and `import horovod.torch` in this process resolve to the API (also registered
as the `hvd_ddp_compare.apis` entry point `horovod`, which the probe uses). In a notebook, the one call

    import ddp_train.horovod_api; ddp_train.horovod_api.install()

before `import horovod.spark` (or `horovod.ray`) does the same. docs/horovod-api.md is the manual.

The modules, each owning one thing:
    aliases         Horovod's module names in sys.modules, and the refusal of the others
    torch_api       the module a script gets as horovod.torch
    runtime         a generation's start and end (hvd.shutdown), ranks and hosts, the process groups, the coordinator
                    and engine, the registry of the process sets that exist, starting and stopping the timeline
    negotiation     rank 0's negotiation, without sockets or threads: which collectives every rank asked for, their
                    order, fusion, joins, errors, stalls (requests in, responses out)
    coordinator     the socket and thread shell around the negotiation, on rank 0
    response_cache  Horovod's response cache: the collectives negotiated before, at bits, the same on every rank
    cycle           each rank's side of the cache: look-ups, the bitwise-AND agreement's vector, the guess, what a
                    cycle runs
    checks          Horovod's cross-rank checks and messages
    engine_core     each rank's engine as a state machine, without threads: requests, responses, cycles, the guess,
                    shutdowns and lost ranks in; requests for rank 0, collectives to run and failures out
    engine          the thread shell around it: one lock, a reader thread, a cycle thread
    dispatch        one collective run with this rank's parts (stand-ins where it holds none), results handed out
    execute         the data of each collective on torch.distributed
    arithmetic      Horovod's scaling (pre/postscale, Average), reducescatter and alltoall splits
    messages        requests, responses and their framing on a socket
    settings        every Horovod environment variable the API reads (Settings)
    handles         handles: a call's parts, its result or error, the numbering
    enqueue         the one way a collective is asked for (submit), poll, synchronize
    calls           what a call of each kind of collective asks for, one dataclass each
    mpi_ops         hvd.init, the collectives (allreduce ... barrier) and their gradients (horovod/torch/mpi_ops.py)
    process_sets    ProcessSet, the global set, adding and removing sets (horovod/common/process_sets.py)
    functions       broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object
                    (horovod/torch/functions.py)
    optimizer       DistributedOptimizer
    buckets         DistributedOptimizer's buckets: their layout, the flat buffer of their gradients
    compression     Compression.none / fp16
    sync_batch_norm SyncBatchNorm (CPU and CUDA)
    elastic         hvd.elastic on torchrun's restarts
    timeline        the timeline (a Chrome trace of the collectives), recorded as runtime starts and stops it
    threads         horovod.runner.util.threads.in_thread
    dtypes          Horovod's types and reduction ops
    exceptions      Horovod's exceptions and the texts of its errors (horovod/common/exceptions.py)
    spark           horovod.spark.run on PySpark's TorchDistributor (horovod/spark/runner.py)
    spark_task      one rank of horovod.spark.run: the API installed, the function run, its outcome reported
    collector       the driver's socket that every rank of horovod.spark.run reports its outcome to
    outcomes        every rank's return value or error, turned into the list in rank order or one exception
    ray_executor    horovod.ray.RayExecutor on Ray actors holding one torch.distributed group (horovod/ray/runner.py)
    ray_worker      the Ray actor of one rank (horovod/ray/worker.py)
    visible         the API's modules back in sys.modules while the driver pickles functions for Spark or Ray
"""

from __future__ import annotations


def install() -> None:
    """`import horovod`, `import horovod.torch` (and the other horovod.* modules the API offers) now give the API in
    this process; any other horovod.* import fails with one line naming what is offered. Imports everything the API
    needs; idempotent."""
    from . import aliases, runtime, visible

    aliases.install()
    runtime.export_placement()
    visible.remember()
