"""The probe's hooks into torch, installed before the user's script starts; nothing in the script changes.

- torch.autograd.backward (Tensor.backward calls it): the loss the script backpropagated; a GradScaler's
  scale() is followed so the loss is recorded unscaled. On the CPU, the part of backward() its thread spent off
  the CPU is exposed communication (DDP waits there for its last buckets; the compute keeps the thread busy).
- torch.optim's global step hooks: every optimizer's step(). A step runs nested when Horovod's
  DistributedOptimizer calls its wrapped class's step after the allreduce: what the innermost call saw (the
  averaged gradients) is recorded when the outermost one returns, and the time between the two calls
  (synchronize(): the wait for the allreduces) is exposed communication.
- torch.nn's global forward hooks: the outermost forward of a module with parameters, in training mode (the
  model, however it is wrapped): the fingerprint of its inputs, and at the first one the weights training
  starts from (after the script's broadcast), disturbed first when the probe was asked to.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, FrozenSet, List, NoReturn, Optional, Tuple

import torch
import torch.optim.optimizer as optim_module
from torch.nn.modules import module as module_hooks

from common.rundir.fingerprint import tensor_norms

from .recorder import Recorder, group_settings, input_fingerprint, state_summary


def params_of(optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
    """The optimizer's parameters, in param-group order."""
    return [p for group in optimizer.param_groups for p in group["params"]]


class Hooks:
    """Follows one script's model and optimizer on this rank and feeds the recorder."""

    def __init__(self, recorder: Recorder, refuse: Callable[[str], NoReturn],
                 on_start: Callable[[torch.nn.Module], None], on_first_step: Callable[[], None],
                 on_reduced: Callable[[torch.optim.Optimizer, List[torch.Tensor]], None],
                 on_stepped: Callable[[int], None]) -> None:
        self.recorder, self.refuse, self.on_start, self.on_first_step = recorder, refuse, on_start, on_first_step
        self.on_reduced, self.on_stepped = on_reduced, on_stepped
        self.model: Optional[torch.nn.Module] = None
        self.wrapper: Optional[torch.nn.Module] = None   # the model's DDP wrapper, for its comm hooks
        self.optimizers: Dict[int, FrozenSet[int]] = {}    # id(optimizer) -> its parameters' ids
        self.forward_depth = 0
        self.step_depth = 0
        self.outer_ready: Optional[float] = None           # when an outermost Horovod step's own hook was done
        self.before: Optional[Dict[str, Any]] = None       # what the innermost step call saw
        self.scaled: Dict[int, float] = {}                 # id(scaled loss) -> the loss before scaling

    # --- installation ------------------------------------------------------------------------------
    def install(self) -> None:
        """Put every hook in place (before the script's first line runs)."""
        self._backward = torch.autograd.backward
        hooks = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> None:  # torch.autograd.backward's arguments
            loss = hooks.loss_of(tensors)
            wall, cpu = time.perf_counter(), time.thread_time()
            result = hooks._backward(tensors, *args, **kwargs)
            if on_cpu(tensors):
                hooks.recorder.waited((time.perf_counter() - wall) - (time.thread_time() - cpu))
            hooks.recorder.backward(loss)
            return result

        torch.autograd.backward = backward
        self._wrap_scalers()
        optim_module.register_optimizer_step_pre_hook(self.on_step_pre)
        optim_module.register_optimizer_step_post_hook(self.on_step_post)
        module_hooks.register_module_forward_pre_hook(self.on_forward_pre)
        module_hooks.register_module_forward_hook(self.on_forward_post, always_call=True)

    def _wrap_scalers(self) -> None:
        """GradScaler.scale(loss) multiplies the loss by the scale: remember the loss it was given."""
        from torch.amp import grad_scaler

        original = grad_scaler.GradScaler.scale
        hooks = self

        def scale(scaler: grad_scaler.GradScaler, outputs: Any) -> Any:  # GradScaler.scale's, of any overload
            scaled = original(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and outputs.numel() == 1 and isinstance(scaled, torch.Tensor):
                hooks.scaled[id(scaled)] = float(outputs.detach())
            return scaled

        grad_scaler.GradScaler.scale = scale  # type: ignore[method-assign, assignment]  # replaced on purpose

    # --- backward ----------------------------------------------------------------------------------
    def loss_of(self, tensors: object) -> Optional[float]:
        """The loss value a backward() was given (unscaled under a GradScaler); None where it is not a scalar."""
        loss = first_tensor(tensors)
        value = None
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            value = self.scaled.pop(id(loss), None)
            if value is None:
                value = float(loss.detach())
        return value

    # --- forward -----------------------------------------------------------------------------------
    def on_forward_pre(self, module: torch.nn.Module, args: Tuple[Any, ...]) -> None:
        self.forward_depth += 1
        if self.forward_depth != 1 or not module.training or not _has_parameters(module):
            return
        if self.model is None:  # the first outermost module with parameters that trains: the model
            self.model = unwrap(module)
            self.wrapper = module if module is not self.model else None
            self.on_start(module)
        self.recorder.forward(input_fingerprint(args))

    def on_forward_post(self, module: torch.nn.Module, args: Tuple[Any, ...], output: Any) -> None:
        self.forward_depth = max(self.forward_depth - 1, 0)

    def ordered(self, optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
        """The parameters a step's fingerprints cover: the model's, in its own order (two scripts may group
        them differently in their optimizers), then any the optimizer has beyond them."""
        params = params_of(optimizer)
        if self.model is None:
            return params
        mine = list(self.model.parameters())
        known = {id(p) for p in mine}
        return mine + [p for p in params if id(p) not in known]

    # --- optimizer steps ---------------------------------------------------------------------------
    def on_step_pre(self, optimizer: torch.optim.Optimizer, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        self.step_depth += 1
        if self.step_depth == 2 and self.outer_ready is not None:  # the outer step synchronized in between
            self.recorder.waited(time.perf_counter() - self.outer_ready)
            self.outer_ready = None
        ids = frozenset(id(p) for p in params_of(optimizer))
        for other in self.optimizers.values():
            if ids != other:
                self.refuse(f"two optimizers step over {'overlapping' if ids & other else 'different'} "
                            f"parameters ({type(optimizer).__name__} among them); the probe follows one model "
                            "trained by one optimizer")
        self.optimizers[id(optimizer)] = ids
        self.recorder.optimizer_started()
        params = self.ordered(optimizer)
        if self.recorder.in_step and (self.step_depth > 1 or not reduces_itself(optimizer)):
            self.on_reduced(optimizer, params)  # the gradients this step applies: reduced, not yet used
        self.before = {"groups": group_settings(optimizer), "state": state_summary(optimizer, params),
                       "gnorm": tensor_norms([p.grad for p in params])}
        if not self.recorder.in_step:  # only a step with no backward before it records the weights it found
            self.before["wnorm_before"] = tensor_norms(params)
        if self.step_depth == 1 and self.recorder.in_step and reduces_itself(optimizer):
            self.outer_ready = time.perf_counter()

    def on_step_post(self, optimizer: torch.optim.Optimizer, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        self.step_depth -= 1
        self.outer_ready = None
        if self.step_depth > 0:
            return
        before, self.before = self.before, None
        assert before is not None, "on_step_pre saw this step first"
        wnorm = tensor_norms(self.ordered(optimizer))
        if self.recorder.in_step:
            if self.recorder.steps == 0:
                self.on_first_step()
            self.recorder.step(before, wnorm)
            self.on_stepped(self.recorder.steps)  # last: with --max-steps it may end the process
        else:
            self.recorder.stepless(before, wnorm)


#: bytes per element of the precisions gradients can be exchanged at below float32
NARROW_BYTES = {"float16": 2, "bfloat16": 2}


#: how gradient_precision() says it found a precision from the gradients' values alone (not how they travel)
SEEN_BY_VALUE = "every reduced gradient is a"


def reduced_bytes(params: List[torch.Tensor], precision: str, how: str) -> int:
    """The bytes each rank hands the gradient allreduces in a step: every dense gradient of the step, at the
    precision a compression or comm hook exchanges it at (a forecast's input, as `reduced_bytes_per_step` of the
    project's loop)."""
    grads = [p.grad for p in params if p.grad is not None and not p.grad.is_sparse]
    narrow = None if how.startswith(SEEN_BY_VALUE) else NARROW_BYTES.get(precision)
    return sum(g.numel() * (narrow or g.element_size()) for g in grads)


def first_tensor(tensors: object) -> object:
    """What backward() was given first (a tensor, or a sequence of them)."""
    return tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors


def on_cpu(tensors: object) -> bool:
    """Whether a backward() from `tensors` runs on the calling thread (a CPU graph); on a GPU the thread waits
    for the device's autograd threads, and its time off the CPU says nothing about communication."""
    first = first_tensor(tensors)
    return isinstance(first, torch.Tensor) and first.device.type == "cpu"


def reduces_itself(optimizer: torch.optim.Optimizer) -> bool:
    """A Horovod-style DistributedOptimizer: its step() waits for the allreduce (`synchronize`), then calls the
    step of the optimizer class it wraps on itself, which the hooks see as a nested step with the reduced
    gradients."""
    return callable(getattr(optimizer, "synchronize", None))


def comm_hook_names(wrapper: Optional[torch.nn.Module]) -> List[str]:
    """The names of the comm hooks registered on a DDP wrapper (fp16_compress_hook, ...)."""
    hooks = getattr(wrapper, "_comm_hooks", None) or []
    return [getattr(hook, "__qualname__", getattr(hook, "__name__", type(hook).__name__)) for hook, _ in hooks]


#: the precisions a script's gradients can be exchanged at, lowest first, with the names that say so in Horovod's
#: compressions (Compression.fp16: FP16Compressor) and DDP's comm hooks (fp16_compress_hook, bf16_compress_hook)
LOW_PRECISIONS = (("float16", torch.float16, "fp16"), ("bfloat16", torch.bfloat16, "bf16"))


def gradient_precision(optimizer: torch.optim.Optimizer, wrapper: Optional[torch.nn.Module],
                       params: List[torch.Tensor]) -> Tuple[str, str]:
    """The precision the script's reduced gradients were rounded at, and how that is known: a Horovod
    optimizer's compression, a DDP comm hook's name, or every reduced gradient element representable in it."""
    compression = getattr(optimizer, "_compression", None)
    named = [getattr(compression, "__name__", type(compression).__name__)] if compression is not None else []
    for precision, _, word in LOW_PRECISIONS:
        if any(word in name.lower() for name in named):
            return precision, f"the optimizer's compression ({named[0]})"
        hooks = [name for name in comm_hook_names(wrapper) if word in name.lower()]
        if hooks:
            return precision, f"DDP's comm hook ({hooks[0]})"
    grads = [p.grad for p in params if p.grad is not None and p.grad.is_floating_point() and not p.grad.is_sparse]
    if grads and any(bool(g.count_nonzero()) for g in grads):
        for precision, dtype, _ in LOW_PRECISIONS:
            if all(torch.equal(g, g.to(dtype).to(g.dtype)) for g in grads):
                return precision, f"{SEEN_BY_VALUE} {precision} number"
    return "float32", "no compression seen"


def _has_parameters(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DistributedDataParallel (or DataParallel) wrapper."""
    while type(module).__name__ in ("DistributedDataParallel", "DataParallel"):
        inner = getattr(module, "module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        module = inner
    return module


def distributed_world() -> Dict[str, Any]:
    """How the script joined the job: its backend ("horovod", "ddp" or "local"), Horovod's controller, and the
    world size the library it initialised says (1 when it initialised none)."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None:
        try:
            if hvd.is_initialized():
                if not hvd.__name__.startswith("horovod"):  # this project's Horovod API on torch.distributed
                    return {"name": "horovod-api", "controller": None, "size": hvd.size(),
                            "process_group": torch.distributed.get_backend()}
                controller = "gloo" if hvd.gloo_enabled() else "mpi" if hvd.mpi_enabled() else None
                return {"name": "horovod", "controller": controller, "size": hvd.size()}
        except (AttributeError, ValueError):
            pass
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return {"name": "ddp", "controller": None, "size": dist.get_world_size(),
                "process_group": dist.get_backend()}
    return {"name": "local", "controller": None, "size": 1}
