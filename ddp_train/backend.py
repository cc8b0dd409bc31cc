"""DDPBackend: PyTorch DistributedDataParallel. The only module that calls torch.distributed.

Who this process is comes from torchrun (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR/PORT), or from Slurm's srun without torchrun (SLURM_PROCID, SLURM_LOCALID,
SLURM_NTASKS, MASTER_ADDR/PORT), or, with neither, a one-process group.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import time

import torch

from common.backend import Backend, env_int
from common.config import UsageError


def _slurm_tasks_on_this_node() -> int:
    """SLURM_STEP_TASKS_PER_NODE looks like '2(x3),1'; this node's entry is at SLURM_NODEID."""
    spec = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE") or "1"
    counts = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = env_int("SLURM_NODEID", default=0)
    return counts[node] if node < len(counts) else (counts[0] if counts else 1)


def _loopback_interface():
    """The name of the interface that holds 127.0.0.1 ('lo' on Linux), or None."""
    import socket

    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return None


class DDPBackend(Backend):
    """torch.distributed with gloo on CPU and NCCL on GPU, DistributedDataParallel for gradients."""

    name = "ddp"

    def __init__(self) -> None:
        super().__init__()
        self._stall_store = None
        env = os.environ
        if "RANK" in env and "WORLD_SIZE" in env:
            self.source = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env"
            self._rank = env_int("RANK")
            self._world = env_int("WORLD_SIZE")
            self._local_rank = env_int("LOCAL_RANK", default=0)
            self._local_world = env_int("LOCAL_WORLD_SIZE", default=self._world)
        elif "SLURM_PROCID" in env:
            self.source = "slurm"
            self._rank = env_int("SLURM_PROCID")
            self._world = env_int("SLURM_NTASKS", default=1)
            self._local_rank = env_int("SLURM_LOCALID", default=0)
            self._local_world = _slurm_tasks_on_this_node()
        else:
            self.source = "single"
            self._rank, self._world, self._local_rank, self._local_world = 0, 1, 0, 1
        self._ddp = None
        self._last_bucket_time = None

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_world_size(self) -> int:
        return self._local_world

    @property
    def world_size(self) -> int:
        return self._world

    def check_environment(self) -> None:
        """Raise UsageError when the launch environment cannot form a group."""
        if self.source == "slurm" and self._world > 1:
            missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
            if missing:
                raise UsageError(
                    f"under srun without torchrun, export {' and '.join(missing)} (the first host of the "
                    "allocation, e.g. $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1), and a free port)")

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
            # A second connection, used only after a failure, to find who stopped taking part.
            self._stall_store = self._store(timeout)
        self.process_group_backend = backend

    # --- naming a rank that stopped taking part --------------------------------------------
    def explain_stall(self):
        """After a failed collective every rank that is still alive checks in at the store and
        waits a moment; the ranks that never check in are the ones that stopped taking part.
        Costs nothing while training runs."""
        store = self._stall_store
        if store is None:
            return None
        try:
            store.set(f"stalled/{self._rank}", str(self.current_step))
            time.sleep(3.0)
            missing = [r for r in range(self._world) if not store.check([f"stalled/{r}"])]
        except Exception:  # noqa: BLE001 - no store, no explanation
            return None
        if not missing:
            return None
        return (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} stopped taking part "
                f"(did not check in after the failed collective at step {self.current_step})")

    def _rendezvous(self, timeout: datetime.timedelta):
        """The store, once every rank has checked in at it; a rank that does not come within the
        timeout is named (a UsageError), as is a taken or unreachable MASTER_PORT."""
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        seconds = f"--timeout {timeout.total_seconds():g} s"
        try:
            store = self._store(timeout)
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
        # No waiting for the other ranks here: _rendezvous() waits, and can then name who is missing.
        store = dist.TCPStore(host, port, self._world, is_master=not agent_hosts_store and self._rank == 0,
                              timeout=timeout, multi_tenant=not agent_hosts_store, wait_for_workers=False)
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
            "bucket_cap_mb": self.bucket_mb,
            "comm_hook": "fp16_compress_hook" if self.compression == "fp16" else "allreduce_hook",
            "compression": self.compression,
            "gradient_average": ("float16: divide by world size, then allreduce sum (fp16_compress_hook)"
                                 if self.compression == "fp16" else
                                 "divide by world size, then allreduce sum (DDP default hook)"),
            "accumulate": self.accumulate,
            "accumulation": "no_sync() for the first K-1 backward passes of a step",
            "trace": "torch.profiler chrome trace of rank 0" if self.profile else None,
        }

    # --- training ------------------------------------------------------------------------
    def wrap(self, model, optimizer):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # Buffers are not broadcast on every forward: Horovod does not either, and the loop
        # synchronises them from rank 0 before evaluating and saving (Backend.broadcast_buffers).
        ddp = DDP(model, device_ids=device_ids, forward_sync_buffers=False, bucket_cap_mb=self.bucket_mb)
        reduce = default_hooks.fp16_compress_hook if self.compression == "fp16" else default_hooks.allreduce_hook

        def timed_allreduce(state, bucket):
            # The allreduce hook (plain or float16), noting when the last bucket was handed to the network.
            self._last_bucket_time = time.perf_counter()
            return reduce(None, bucket)

        ddp.register_comm_hook(state=None, hook=timed_allreduce)
        self._ddp = ddp
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
