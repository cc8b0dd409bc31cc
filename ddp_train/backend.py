"""DDPBackend: PyTorch DistributedDataParallel. The only module that calls torch.distributed.

Who this process is comes from torchrun (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR/PORT), or from Slurm's srun without torchrun (SLURM_PROCID, SLURM_LOCALID,
SLURM_NTASKS, MASTER_ADDR/PORT), or, with neither, a one-process group.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import time
from typing import TYPE_CHECKING, Any, Dict, Optional

import torch

from common.errors import UsageError
from common.launch.placement import detect
from common.loop.backend import Backend

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel


def _listening_socket(host: str, port: int) -> int:
    """A socket listening on `host`'s address (IPv4 first) at `port`, handed over as a file descriptor."""
    import socket

    family, _, _, _, address = sorted(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM),
                                      key=lambda info: info[0] != socket.AF_INET)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store does: a restart may reuse it
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def _loopback_interface():
    """The name of the interface that holds 127.0.0.1 ('lo' on Linux), or None."""
    import socket

    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return None


def buffers_not_synced_each_forward(ddp_init) -> dict:
    """DDP's keyword that stops it broadcasting the buffers from rank 0 at every forward, for this torch:
    `forward_sync_buffers=False` (torch 2.13 on; buffers still synced once at wrap), else `broadcast_buffers=False`
    (torch 2.11, 2.12: which also leaves the buffers out of the sync at wrap, so wrap() broadcasts them itself)."""
    import inspect

    if "forward_sync_buffers" in inspect.signature(ddp_init).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


#: torch's default comm hooks divide each bucket by the process group's size, then allreduce the sum
HOOK_DIVIDES = {"allreduce_hook": "before_sum", "fp16_compress_hook": "before_sum"}


#: DDP's own bucket_cap_mb when none is given
DDP_DEFAULT_BUCKET_MB = 25.0


def ddp_bucket_cap_mb(bucket_mb: float) -> Optional[float]:
    """What DDP is given for --bucket-mb: nothing at DDP's default size, so that DDP keeps its own layout (a first
    bucket of 1 MiB, for communication to start early, then 25 MiB ones); a size DDP is given applies to its first
    bucket too."""
    return None if bucket_mb == DDP_DEFAULT_BUCKET_MB else bucket_mb


class DDPBackend(Backend):
    """torch.distributed with gloo on CPU and NCCL on GPU, DistributedDataParallel for gradients."""

    name = "ddp"

    def __init__(self) -> None:
        super().__init__()
        self._placement = placement = detect()
        # torchrun's (or hand-set) RANK/WORLD_SIZE, Slurm's variables under srun, or a lone process.
        self.source = {"env": "torchrun" if placement.launcher == "torchrun" else "env",
                       "slurm": "slurm", None: "single"}.get(placement.family, placement.family)
        self._rank, self._world = placement.rank, placement.world_size
        self._local_world = placement.local_world_size
        self._ddp: Optional[DistributedDataParallel] = None
        self._last_bucket_time: Optional[float] = None
        #: what DDP itself says it was built with (its logging data), read once wrap() has built it
        self._ddp_built: Dict[str, Any] = {}

    def placement(self):
        return self._placement

    def check_environment(self) -> None:
        """Raise UsageError when the launch environment cannot form a group."""
        if self.source in ("torchrun", "single") or self._world == 1:
            return
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing and self.source == "slurm":
            raise UsageError(
                f"under srun without torchrun, export {' and '.join(missing)} (the first host of the "
                "allocation, e.g. $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1), and a free port)")
        if missing:
            raise UsageError(f"without torchrun, export {' and '.join(missing)} (rank 0's host and a free port) on "
                             "every rank, or start the job with torchrun")

    def init(self, timeout_s: float) -> None:
        import torch.distributed as dist

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        if self.source == "single" or self._world == 1 and not os.environ.get("MASTER_ADDR"):
            # One process: an in-memory store, no port to open.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            if backend == "gloo" and self._local_world == self._world and "GLOO_SOCKET_IFNAME" not in os.environ:
                # Every rank is on this host: gloo's connections need not listen beyond loopback (by
                # default gloo listens on the address the host name resolves to, often a public one).
                loopback = _loopback_interface()
                if loopback:
                    os.environ["GLOO_SOCKET_IFNAME"] = loopback
            store = self._rendezvous(timeout)
            dist.init_process_group(backend, store=store, rank=self._rank, world_size=self._world, timeout=timeout)
        self.process_group_backend = backend

    def _rendezvous(self, timeout: datetime.timedelta):
        """The store, once every rank has checked in at it; a rank that does not come within the
        timeout is named (a UsageError), as is a taken or unreachable MASTER_PORT."""
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        seconds = f"--timeout {timeout.total_seconds():g} s"
        try:
            store = self._store(timeout)
        except OSError as exc:  # binding MASTER_PORT ourselves
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"MASTER_PORT {os.environ.get('MASTER_PORT')} is already in use on this host; "
                                 "export a free MASTER_PORT (python -m common.doctor --port N checks one)") from None
            raise UsageError(f"cannot listen on MASTER_ADDR:MASTER_PORT {where} on this host ({exc.strerror}); "
                             "MASTER_ADDR must name rank 0's host") from None
        except RuntimeError as exc:
            if "EADDRINUSE" in str(exc) or "address already in use" in str(exc):
                raise UsageError(f"MASTER_PORT {os.environ.get('MASTER_PORT')} is already in use on this host; "
                                 "export a free MASTER_PORT (python -m common.doctor --port N checks one)") from None
            raise UsageError(f"cannot reach the rendezvous at {where} within {seconds}: check that rank 0 started "
                             "and that every rank has the same MASTER_ADDR and MASTER_PORT") from None
        store.set(f"joined/{self._rank}", "1")
        try:
            store.wait([f"joined/{r}" for r in range(self._world)], timeout)
        except RuntimeError:
            missing = [r for r in range(self._world) if not store.check([f"joined/{r}"])]
            if not missing:
                raise
            raise UsageError(f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not join the "
                             f"rendezvous at {where} within {seconds}; start all {self._world} ranks, or check "
                             "that they can reach it") from None
        return store

    def _store(self, timeout: datetime.timedelta):
        """The rendezvous store at MASTER_ADDR:MASTER_PORT, with keys private to this attempt.

        Under torchrun the agent's store outlives a restart (--max-restarts); without a prefix per
        attempt, restarted ranks read the previous attempt's addresses and fail to connect.
        """
        import torch.distributed as dist

        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        hosts_store = not agent_hosts_store and self._rank == 0
        # The store listens only on the address the ranks are told to reach (torch's own would listen on
        # every interface): 127.0.0.1 for MASTER_ADDR=127.0.0.1, the host's address for its name.
        listen_fd = _listening_socket(host, port) if hosts_store else None
        # No waiting for the other ranks here: _rendezvous() waits, and can then name who is missing.
        store = dist.TCPStore(host, port, self._world, is_master=hosts_store, timeout=timeout,
                              multi_tenant=not agent_hosts_store, wait_for_workers=False, master_listen_fd=listen_fd)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"ddp_train/attempt_{attempt}", store)

    def shutdown(self) -> None:
        import gc

        import torch.distributed as dist

        # Free the DDP reducer (which holds gloo work and the comm hook) while the group is
        # alive: left to interpreter exit, its threads can abort the process ("terminate called").
        self._ddp = None
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()

    def describe(self) -> dict:
        import torch.distributed as dist

        return {
            "name": self.name,
            "process_group": dist.get_backend() if dist.is_initialized() else None,
            "launch": self.source,
            "broadcast_buffers": False,
            "gloo_interface": os.environ.get("GLOO_SOCKET_IFNAME"),
            "bucket_cap_mb": self.tuning.config.bucket_mb,
            "ddp_built": self._ddp_built,  # read from DDP once built, not what it was given
            "divide_by_world_size": HOOK_DIVIDES.get(self._ddp_built.get("hook_averages_with", "")),
            "comm_hook": "fp16_compress_hook" if self.tuning.config.compression == "fp16" else "allreduce_hook",
            "compression": self.tuning.config.compression,
            "gradient_average": ("float16: divide by world size, then allreduce sum (fp16_compress_hook)"
                                 if self.tuning.config.compression == "fp16" else
                                 "divide by world size, then allreduce sum (DDP default hook)"),
            "accumulate": self.tuning.config.accumulate,
            "deterministic": self.tuning.config.deterministic,
            "predivide": self.tuning.config.predivide,  # DDP divides before the sum either way
            "accumulation": "no_sync() for the first K-1 backward passes of a step",
            "trace": "torch.profiler chrome trace of rank 0" if self.tuning.config.profile else None,
        }

    # --- training ------------------------------------------------------------------------
    def wrap(self, model, optimizer):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # Buffers are not broadcast on every forward: Horovod does not either, and the loop
        # synchronises them from rank 0 before evaluating and saving (Backend.broadcast_buffers).
        buffers = buffers_not_synced_each_forward(DDP.__init__)
        if "broadcast_buffers" in buffers:  # this torch's DDP leaves them out of its sync at wrap too
            self.broadcast_buffers(model)
        cap_mb = ddp_bucket_cap_mb(self.tuning.config.bucket_mb)
        ddp = DDP(model, device_ids=device_ids, bucket_cap_mb=cap_mb, **buffers)
        reduce = (default_hooks.fp16_compress_hook if self.tuning.config.compression == "fp16"
                  else default_hooks.allreduce_hook)

        def timed_allreduce(state, bucket):
            # The allreduce hook (plain or float16), noting when the last bucket was handed to the network.
            self._last_bucket_time = time.perf_counter()
            # None: the default group (the hooks take it; their annotation says ProcessGroup only)
            return reduce(None, bucket)  # type: ignore[arg-type]

        ddp.register_comm_hook(state=None, hook=timed_allreduce)
        self._ddp = ddp
        logged = ddp._get_ddp_logging_data()  # DDP's own record of its reducer: its bucket cap, its hook
        self._ddp_built = {"bucket_cap_bytes": logged.get("bucket_cap_bytes"),
                           # (torch 2.14's DDP keeps its first bucket's cap here, not in its logging data)
                           "first_bucket_cap_bytes": ddp._bucket_config.first_bucket_bytes_cap,
                           "comm_hook": logged.get("comm_hook"),
                           "hook_averages_with": reduce.__name__,
                           "buffers_keyword": next(iter(buffers))}
        return ddp, optimizer

    def unwrap(self, model):
        return model.module if hasattr(model, "module") else model

    def accumulating(self, model):
        # The reducer skips the allreduce; gradients add up in .grad until a backward outside no_sync.
        return model.no_sync()

    @contextlib.contextmanager
    def gradients_ready(self, optimizer):
        # DDP's backward() returns only when every bucket's allreduce finished; the time from
        # the last bucket's launch to here is communication that compute did not hide.
        if self._last_bucket_time is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self._comm_seconds += time.perf_counter() - self._last_bucket_time
            self._last_bucket_time = None
        yield

    # --- collectives ---------------------------------------------------------------------
    def all_reduce_sum(self, values):
        import torch.distributed as dist

        device = self.device if self.process_group_backend == "nccl" else torch.device("cpu")
        tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return [float(v) for v in tensor.cpu()]

    def _started_all_reduce(self, tensor):
        import torch.distributed as dist

        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True).wait

    def broadcast_module(self, module):
        import torch.distributed as dist

        if self._world == 1:
            return
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)

    def broadcast_buffers(self, module):
        import torch.distributed as dist

        if self._world == 1:
            return
        for buffer in module.buffers():
            dist.broadcast(buffer.data, src=0)

    def all_gather_object(self, obj):
        import torch.distributed as dist

        out = [None] * self._world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()
