"""HorovodBackend: ring-allreduce through Horovod. The only module that imports horovod.

Runs under `horovodrun` (Gloo or MPI controller), plain `mpirun`, `srun` with PMI, or alone.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import torch

from common.errors import UsageError
from common.launch.openmpi import MPI_YIELD_VARIABLE, yield_mpi_when_idle
from common.launch.placement import Placement, detect
from common.loop.backend import Backend
from common.loop.profiling import Trace

from .launch import SIGKILL_GRACE_S
from .waiting import Waiter, choose_wait

#: On CPU, Horovod's background thread takes a share of a core every cycle (HOROVOD_CYCLE_TIME), and
#: that share comes out of the ranks' compute. A model with at least this many bytes of gradients has
#: steps long enough that a longer cycle costs it no measurable latency and gives the share back
#: (measured: benchmarks/results/horovod_cycle_scaling*/); a small model keeps Horovod's 1 ms, its steps are
#: milliseconds.
LONG_CYCLE_MIN_GRADIENT_BYTES = 16 * 2**20
#: The long cycle per controller. Gloo's agreement each cycle is a collective through its TCP loop thread, whose
#: cost on an idle rank falls with the cycle (benchmarks/results/horovod_cycle.json). MPI keeps 5 ms.
LONG_CYCLE_MS = {"gloo": 20, "mpi": 5}

#: Open MPI's mpirun passes SIGINT/SIGTERM on to the ranks this many seconds after it got it, and kills them as
#: long again later (1 by default): too soon for the ranks to agree to stop and write a final checkpoint.
SIGKILL_TIMEOUT_VARIABLE = "OMPI_MCA_odls_base_sigkill_timeout"

HOROVOD_MISSING = ("Horovod is not importable in this environment ({error}); run `make setup`, which "
                   "builds horovod 0.28.1 against this torch, or use ddp_train")


def import_horovod():
    """horovod.torch, or UsageError saying how to get it."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:  # also the extension failing to load against another torch
        raise UsageError(HOROVOD_MISSING.format(error=exc)) from None
    return hvd


def controller_before_init(hvd) -> str:
    """The controller hvd.init() will start: HOROVOD_CONTROLLER (horovodrun --gloo sets it), else MPI when
    Horovod was built with it (mpirun, horovodrun --mpi, a lone process), else Gloo."""
    chosen = os.environ.get("HOROVOD_CONTROLLER", "").lower()
    if chosen in ("gloo", "mpi"):
        return chosen
    return "mpi" if hvd.mpi_built() else "gloo"


#: Open MPI's byte-transfer layers. Its TCP one listens on every interface, whatever btl_tcp_if_include
#: says, and a job whose ranks share one host does not need it: shared memory (vader) carries everything.
MPI_BTL_VARIABLE = "OMPI_MCA_btl"
#: selections that leave the TCP transport in: Open MPI's default, and horovodrun --mpi's `-mca btl ^openib`
BTL_WITH_TCP = ("", "^openib")


def one_host_shared_memory(single_host: bool) -> str | None:
    """Under Open MPI with every rank on this host, select the shared-memory transport only (self,vader)
    so that no rank listens on a TCP port, unless mpirun was given another choice (`--mca btl ...`).
    Read by MPI_Init inside hvd.init(). Returns where the value came from (None when not Open MPI)."""
    if "OMPI_COMM_WORLD_SIZE" not in os.environ:
        return None
    if os.environ.get(MPI_BTL_VARIABLE, "") not in BTL_WITH_TCP:
        return "environment"
    if not single_host:
        return "Open MPI's default"
    os.environ[MPI_BTL_VARIABLE] = "self,vader"
    return "hvd_train: every rank on this host"


class HorovodBackend(Backend):
    """Horovod's DistributedOptimizer averages gradients with hooks fired during backward."""

    name = "horovod"

    def __init__(self) -> None:
        super().__init__()
        # horovod.torch once check_environment() imported it (Horovod ships no type information: Any)
        self.hvd: Any = None
        self._launched_as = detect()

    def check_environment(self) -> None:
        """Raise UsageError when Horovod cannot be used here."""
        self.hvd = import_horovod()

    def placement(self) -> Placement:
        if not self._initialised():  # before hvd.init() the launcher's variables tell who we are
            return self._launched_as
        hvd = self.hvd
        return Placement(self._launched_as.launcher, self._launched_as.family, hvd.rank(), hvd.size(),
                         hvd.local_rank(), hvd.local_size())

    @property
    def elastic(self) -> bool:
        """Started by horovodrun's elastic driver (--min-np/--max-np/--host-discovery-script)."""
        return os.environ.get("HOROVOD_ELASTIC") == "1"

    def _initialised(self) -> bool:
        return self.hvd is not None and self.hvd.is_initialized()

    def init(self, timeout_s: float) -> None:
        # Horovod's stall inspector names the ranks missing from a collective, and with a shutdown
        # time ends the job instead of waiting forever. Both are read by hvd.init().
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, int(timeout_s // 2))))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(max(2, int(timeout_s))))
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(1, int(timeout_s))))
        # --bucket-mb wins over a HOROVOD_FUSION_THRESHOLD from the environment (describe() records both).
        self._env_fusion_threshold = os.environ.get("HOROVOD_FUSION_THRESHOLD")
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(self.fusion_threshold_bytes)
        if (self._env_fusion_threshold not in (None, os.environ["HOROVOD_FUSION_THRESHOLD"])
                and self._launched_as.rank == 0):
            print(f"hvd_train: HOROVOD_FUSION_THRESHOLD={self._env_fusion_threshold} is overridden by --bucket-mb "
                  f"{self.tuning.config.bucket_mb:g} ({self.fusion_threshold_bytes} bytes)", flush=True)
        self._choose_cycle_time()
        self.wait, self.wait_source = choose_wait(self.device)
        self.mpi_yield_source = yield_mpi_when_idle(self.device.type == "cpu", "hvd_train: training on CPU")
        self.mpi_btl_source = one_host_shared_memory(self._launched_as.single_host)
        if self.tuning.config.profile:
            # hvd.start_timeline() works only when the timeline was enabled at init.
            os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
        self.hvd.init()
        self.waiter = Waiter(self.hvd, self.wait)
        if self.hvd.mpi_enabled() and self.mpi_yield_source.startswith("hvd_train") and self.hvd.rank() == 0:
            print(f"hvd_train: {MPI_YIELD_VARIABLE}=1 (training on CPU: Open MPI yields the core while it waits); "
                  f"set it to 0 or pass mpirun --mca mpi_yield_when_idle 0 to busy-poll", flush=True)
        if "OMPI_COMM_WORLD_SIZE" in os.environ and SIGKILL_TIMEOUT_VARIABLE not in os.environ \
                and self.hvd.rank() == 0:
            print(f"hvd_train: mpirun kills the ranks 1 s after it passes Ctrl-C or SIGTERM on, too soon for a final "
                  f"checkpoint; pass mpirun --mca odls_base_sigkill_timeout {SIGKILL_GRACE_S} (horovodrun --mpi: "
                  f"--mpi-args=\"--mca odls_base_sigkill_timeout {SIGKILL_GRACE_S}\")", flush=True)

    def _choose_cycle_time(self) -> None:
        """HOROVOD_CYCLE_TIME as given (horovodrun --cycle-time-ms sets it too); when unset, a longer
        cycle for a large model trained on CPU, else Horovod's own default. Read by hvd.init()."""
        mb = self.tuning.gradient_bytes / 2**20
        if not os.environ.get("HOROVOD_CYCLE_TIME"):
            os.environ.pop("HOROVOD_CYCLE_TIME", None)  # empty: Horovod would read 0 ms, a busy loop
        if os.environ.get("HOROVOD_CYCLE_TIME"):
            self.cycle_time_source = "environment"
        elif self.tuning.gradient_bytes >= LONG_CYCLE_MIN_GRADIENT_BYTES and self.device.type == "cpu":
            controller = controller_before_init(self.hvd)
            cycle_ms = LONG_CYCLE_MS[controller]
            os.environ["HOROVOD_CYCLE_TIME"] = str(cycle_ms)
            self.cycle_time_source = f"hvd_train: {mb:.0f} MB of gradients on CPU, {controller} controller"
            if self._launched_as.rank == 0:
                print(f"hvd_train: HOROVOD_CYCLE_TIME={cycle_ms} (the model has {mb:.0f} MB of gradients and "
                      f"trains on CPU, {controller} controller); set HOROVOD_CYCLE_TIME to choose another", flush=True)
        else:
            self.cycle_time_source = "Horovod's default"

    def shutdown(self) -> None:
        if self._initialised():
            self.hvd.shutdown()

    def describe(self) -> dict:
        hvd = self.hvd
        return {
            "name": self.name,
            "controller": "gloo" if hvd.gloo_enabled() else ("mpi" if hvd.mpi_enabled() else "unknown"),
            "nccl_built": bool(hvd.nccl_built()),
            "fusion_threshold_bytes": self.fusion_threshold_bytes,  # init() always sets it from --bucket-mb
            "fusion_threshold_env_overridden": getattr(self, "_env_fusion_threshold", None),
            # what Horovod reads at init: the environment this process handed it
            "fusion_threshold_env": os.environ.get("HOROVOD_FUSION_THRESHOLD"),
            "cycle_time_ms": float(os.environ.get("HOROVOD_CYCLE_TIME", "1") or 1),
            "cycle_time_source": getattr(self, "cycle_time_source", None),
            "mpi_yield_when_idle": os.environ.get(MPI_YIELD_VARIABLE) if hvd.mpi_enabled() else None,
            "mpi_yield_source": getattr(self, "mpi_yield_source", None) if hvd.mpi_enabled() else None,
            "mpi_btl": os.environ.get(MPI_BTL_VARIABLE) if hvd.mpi_enabled() else None,
            "mpi_btl_source": getattr(self, "mpi_btl_source", None) if hvd.mpi_enabled() else None,
            "compression": self.tuning.config.compression,
            "gradient_average": self._gradient_average(),
            **self._averaging(),
            "deterministic": self.tuning.config.deterministic,
            "predivide": self.tuning.config.predivide,
            "wait": getattr(self, "wait", None),
            "wait_source": getattr(self, "wait_source", None),
            "backward_passes_per_step": self.tuning.config.accumulate,
            "elastic": self.elastic,
            "trace": "Horovod timeline (HOROVOD_TIMELINE=DYNAMIC, start_timeline/stop_timeline)"
                     if self.tuning.config.profile else None,
        }

    def _averaging(self) -> dict:
        """How the DistributedOptimizer that wrap() built averages: its op and predivide factor, read from it."""
        optimizer = getattr(self, "_distributed_optimizer", None)
        if optimizer is None:
            return {"allreduce_op": None, "gradient_predivide_factor": None, "divide_by_world_size": None}
        op = {self.hvd.Average: "Average", self.hvd.Sum: "Sum"}.get(optimizer.op, str(optimizer.op))
        factor = float(optimizer.gradient_predivide_factor)
        order = "before_sum" if op == "Average" and factor == float(self.world_size) != 1.0 else \
            "after_sum" if op == "Average" else None
        return {"allreduce_op": op, "gradient_predivide_factor": factor, "divide_by_world_size": order}

    def _gradient_average(self) -> str:
        """How this backend averages gradients, in words, for config.json."""
        dtype = "float16: " if self.tuning.config.compression == "fp16" else ""
        if self.tuning.config.predivide:
            return dtype + "scale by 1/world size, then allreduce sum (gradient_predivide_factor = world size)"
        return dtype + "allreduce sum, then scale by 1/world size (op=Average)"

    @property
    def fusion_threshold_bytes(self) -> int:
        """--bucket-mb in bytes, for HOROVOD_FUSION_THRESHOLD (MB = 2**20 bytes, as DDP's bucket_cap_mb);
        0 (no fusion) with --deterministic: which tensors a fused buffer holds follows their timing, and
        where a gradient sits in the buffer decides the order its sum is added in on 3 ranks or more."""
        return 0 if self.tuning.config.deterministic else int(self.tuning.config.bucket_mb * 1024 * 1024)

    # --- training ------------------------------------------------------------------------
    def wrap(self, model, optimizer):
        hvd = self.hvd
        # Parameters and buffers from rank 0. A fresh optimizer's state is NOT broadcast:
        # broadcast_optimizer_state would run a zero-gradient step, which moves weights under
        # Adam or weight decay and breaks parity with DDP.
        if not self.elastic:  # elastic: rejoin() broadcasts, once the job's members are known
            broadcast_state(self.waiter, model.state_dict())
        # backward_passes_per_step=K: gradients add up locally over K backward passes, then the sum is
        # averaged over ranks (op=Average divides by world size only; the loop divides the loss by K),
        # which is what DDP's no_sync() accumulation gives.
        compression = layout_preserving(hvd.Compression.fp16 if self.tuning.config.compression == "fp16"
                                        else hvd.Compression.none)
        # --predivide: divide by the world size before the sum, as DDP does (Horovod: gradient_predivide_factor
        # divides by the factor before the sum and by world size / factor after it).
        predivide = float(self.world_size) if self.tuning.config.predivide else 1.0
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             op=hvd.Average, compression=compression,
                                             backward_passes_per_step=self.tuning.config.accumulate,
                                             gradient_predivide_factor=predivide)
        self._distributed_optimizer = optimizer
        return model, optimizer

    @contextlib.contextmanager
    def gradients_ready(self, optimizer):
        # Allreduces were launched by hooks during backward; synchronize() waits for the ones
        # still in flight, which is the communication that compute did not hide.
        started = time.perf_counter()
        with self.activity.waiting("the gradient allreduce"):
            self.waiter.before_synchronize(optimizer)
            optimizer.synchronize()
        self._comm_seconds += time.perf_counter() - started
        yield

    def step(self, optimizer, scaler=None) -> None:
        # Gradients were synchronized in gradients_ready(); the step (or GradScaler's) must not do it again.
        with optimizer.skip_synchronize():
            super().step(optimizer, scaler)

    def trace(self, folder):
        return HorovodTimeline(self.hvd, os.path.join(folder, "horovod-timeline.json"), self.is_main)

    # --- collectives ---------------------------------------------------------------------
    def all_reduce_sum(self, values):
        tensor = torch.tensor(list(values), dtype=torch.float64)
        return [float(v) for v in self.waiter.result(self.hvd.allreduce_async(tensor, op=self.hvd.Sum))]

    def _started_all_reduce(self, tensor):
        handle = self.hvd.allreduce_async_(tensor, op=self.hvd.Sum)
        return lambda: self.waiter.result(handle)

    def broadcast_module(self, module):
        broadcast_state(self.waiter, module.state_dict())

    def broadcast_buffers(self, module):
        if self.world_size == 1:
            return
        self.waiter.broadcast(module.named_buffers())

    def all_gather_object(self, obj):
        return self.hvd.allgather_object(obj)

    def barrier(self) -> None:
        # A sum of zeros every rank must join: a barrier whose wait is the Waiter's (hvd.barrier() spins).
        self.waiter.result(self.hvd.allreduce_async(torch.zeros(1), op=self.hvd.Sum))


class HorovodTimeline(Trace):
    """Horovod's timeline (chrome trace events of every tensor's negotiation and allreduce, all
    ranks) between start and stop; the coordinator (rank 0) writes it. Needs HOROVOD_TIMELINE
    set before hvd.init() (HorovodBackend.init does it when profiling)."""

    def __init__(self, hvd, path: str, is_main: bool) -> None:
        self.hvd, self.path, self.is_main = hvd, path, is_main

    def start(self) -> None:
        if self.is_main:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.hvd.start_timeline(self.path, mark_cycles=False)

    def stop(self) -> None:
        self.hvd.stop_timeline()


def broadcast_state(waiter: Waiter, state) -> None:
    """Rank 0's state_dict everywhere (hvd.broadcast_parameters), also when it holds channels-last tensors:
    Horovod sends only contiguous tensors, so those travel as contiguous copies and are copied back."""
    contiguous = {name: tensor.contiguous() for name, tensor in state.items()}
    waiter.broadcast(contiguous.items())
    for name, tensor in state.items():
        if contiguous[name] is not tensor:
            tensor.copy_(contiguous[name])


def layout_preserving(compression):
    """A Horovod Compression that sends gradients contiguous and gives them back in their own
    memory layout: Horovod reduces only contiguous tensors, and the gradients of channels-last
    weights are not (--channels-last). A contiguous gradient passes through untouched."""

    class LayoutPreserving:
        @staticmethod
        def compress(tensor):
            layout = None
            if not tensor.is_contiguous() and tensor.dim() == 4 and tensor.is_contiguous(
                    memory_format=torch.channels_last):
                layout = torch.channels_last
            compressed, ctx = compression.compress(tensor.contiguous())
            return compressed, (ctx, layout)

        @staticmethod
        def decompress(tensor, ctx):
            inner, layout = ctx
            tensor = compression.decompress(tensor, inner)
            return tensor.contiguous(memory_format=layout) if layout is not None else tensor

    LayoutPreserving.__name__ = f"LayoutPreserving{compression.__name__}"
    return LayoutPreserving
