"""The numerics of the one training loop: mixed precision (autocast around forward and loss, and, float16
only, a GradScaler whose state travels in checkpoints), and what else a result's bits depend on in a process:
its thread count and torch's deterministic algorithms."""

from __future__ import annotations

import contextlib
from typing import ContextManager, Optional

import torch

from common.config import Config
from common.launch.placement import default_threads

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: intra-op threads per process in --reduction exact unless --threads says otherwise
EXACT_THREADS = 1


def set_numerics(config: Config, local_world_size: int) -> int:
    """Set this process's intra-op thread count and, with --deterministic, torch's deterministic algorithms;
    returns the thread count: --threads, else 1 in exact mode, else this host's cores shared among its
    `local_world_size` processes. Exact mode computes every micro-batch with the same thread count at every
    world size: the thread count can change a result's bits."""
    threads = config.threads or (EXACT_THREADS if config.exact else default_threads(local_world_size))
    torch.set_num_threads(threads)
    if config.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    return threads


class Precision:
    """What --amp asks for on one device: `autocast()` for forward+loss, `scale(loss)` before
    backward, `unscale(optimizer)` before reading gradients, and the `scaler` handed to
    Backend.step (None unless float16)."""

    def __init__(self, amp: str, device: torch.device) -> None:
        self.amp = amp
        self.device_type = device.type
        self.dtype = AMP_DTYPES.get(amp)
        # float16 needs loss scaling so small gradients do not flush to zero; bfloat16 has
        # float32's exponent range and does not. Float16 on CPU is refused by the config check.
        self.scaler: Optional[torch.amp.GradScaler] = (
            torch.amp.GradScaler(device.type) if amp == "fp16" else None)

    def autocast(self) -> ContextManager:
        """Context for forward and loss: autocast to the --amp dtype, or nothing."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on (multiplied by the loss scale under float16)."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the averaged gradients by the loss scale, in place (call inside
        Backend.gradients_ready, before clipping)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def state_dict(self) -> Optional[dict]:
        """The GradScaler's state (scale, growth tracker) for a checkpoint, or None."""
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: Optional[dict]) -> None:
        """Restore the GradScaler from a checkpoint (a checkpoint without one leaves it fresh)."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def describe(self) -> dict:
        """Settings for config.json."""
        return {"amp": self.amp, "autocast_dtype": str(self.dtype).replace("torch.", "") if self.dtype else None,
                "grad_scaler": self.scaler is not None}
