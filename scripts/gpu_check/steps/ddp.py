"""Steps 1 and 2: ddp_train under torchrun at the GPU count, as it is and with each precision and memory format."""

from __future__ import annotations

from ..context import Context
from ..record import Skipped, StepFailed, StepRecord
from .base import Step
from .training import options, train


class Ddp(Step):
    """Step 1: NCCL, a rank per GPU, a finite loss; samples/s with the GPU to itself."""

    def run(self, ctx: Context, record: StepRecord, until: float) -> None:
        """One run with the training of every run."""
        train(ctx, record, until, options(ctx), ctx.settings.work / "ddp")


class AmpFp16(Step):
    """Step 2: float16 autocast with a GradScaler (CUDA only)."""

    def run(self, ctx: Context, record: StepRecord, until: float) -> None:
        """One run with --amp fp16, which must have a GradScaler."""
        if ctx.settings.device == "cpu":
            raise Skipped("float16 autocast with a GradScaler runs on CUDA only (refused on CPU: tests/test_knobs.py)")
        run = train(ctx, record, until, options(ctx, amp="fp16"), ctx.settings.work / "amp_fp16")
        if not (run.precision or {}).get("grad_scaler"):
            raise StepFailed("--amp fp16 ran without a GradScaler")


class AmpBf16(Step):
    """Step 2: bfloat16 autocast."""

    def run(self, ctx: Context, record: StepRecord, until: float) -> None:
        """One run with --amp bf16, recorded as such."""
        run = train(ctx, record, until, options(ctx, amp="bf16"), ctx.settings.work / "amp_bf16")
        if (run.precision or {}).get("amp") != "bf16":
            raise StepFailed(f"--amp bf16 recorded precision {run.precision}")


class ChannelsLast(Step):
    """Step 2: the model and inputs in channels-last memory format."""

    def run(self, ctx: Context, record: StepRecord, until: float) -> None:
        """One run with --channels-last, recorded as such."""
        run = train(ctx, record, until, options(ctx, channels_last=""), ctx.settings.work / "channels_last")
        if run.channels_last is not True:
            raise StepFailed("--channels-last is not recorded in config.json")
