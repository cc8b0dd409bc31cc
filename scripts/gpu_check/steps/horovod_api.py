"""Step 4: a script written for Horovod (examples/gpu/train_horovod.py) on the project's Horovod API under
torchrun, its tensors on NCCL."""

from __future__ import annotations

import json
import shutil

from ..context import Context
from ..record import StepFailed, StepRecord
from .base import Step
from .training import NCCL_VERSION, torchrun

#: the Horovod-style script and its arguments
HVD_SCRIPT = "examples/gpu/train_horovod.py"
HVD_ARGS = {"cuda": ["--model", "resnet18", "--batch-size", "64", "--num-iters", "5"],
            "cpu": ["--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--num-warmup-batches", "1",
                    "--num-batches-per-iter", "1", "--num-iters", "2", "--no-cuda"]}


class HorovodApi(Step):
    """Every worker on its own device, hvd.allreduce sums, rank 0's weights everywhere."""

    def run(self, ctx: Context, record: StepRecord, until: float) -> None:
        """The script under torchrun -m ddp_train.horovod_api; what it wrote (--result) recorded and checked."""
        cuda, nproc = ctx.settings.device == "cuda", ctx.found.nproc
        out = ctx.settings.work / "horovod_api"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        result_file = out / "result.json"
        cmd = torchrun(ctx, nproc, ["-m", "ddp_train.horovod_api", HVD_SCRIPT, *HVD_ARGS[ctx.settings.device],
                                    "--result", str(result_file), *ctx.settings.forced(record.name)])
        output = ctx.run(record, cmd, until)
        try:
            result = json.loads(result_file.read_text())
        except (OSError, ValueError) as exc:
            raise StepFailed(f"{HVD_SCRIPT} wrote no result ({exc})") from None
        nccl = NCCL_VERSION.findall(output)
        record.result.update(result, nccl=nccl[0] if nccl else None)
        if result["size"] != nproc:
            raise StepFailed(f"hvd.size() is {result['size']}, not {nproc}")
        for worker in result["workers"]:
            want = f"cuda:{worker['local_rank']}" if cuda else "cpu"
            if worker["device"] != want:
                raise StepFailed(f"worker {worker['rank']} trained on {worker['device']}, not {want}")
        if result["allreduce_sum"] != result["allreduce_sum_expected"]:
            raise StepFailed(f"hvd.allreduce(rank, op=hvd.Sum) gave {result['allreduce_sum']}, not "
                             f"{result['allreduce_sum_expected']}")
        if not result["weights_equal"]:
            raise StepFailed("the workers ended with different weights")
        if not result["losses_finite"]:
            raise StepFailed("a loss is not finite")
        if cuda and not (result["nccl_built"] and nccl):
            raise StepFailed("CUDA tensors did not travel on NCCL (hvd.nccl_built() 0 or no 'NCCL version' line)")
