"""TensorBoard event files from rank 0, fed by the same events that go to metrics.jsonl.

`tensorboard --logdir RUN_DIR/tensorboard` (or a folder of run directories) shows loss, top-1/top-5,
learning rate and samples/s against the global optimizer step, the axis torchrun and Horovod
examples use, so curves of runs at different world sizes line up by step.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from .names import TENSORBOARD_DIR

#: (event kind, field in the event) -> TensorBoard tag
SCALARS = {
    ("step", "loss"): "train/batch_loss",
    ("step", "lr"): "train/lr",
    ("epoch", "train_loss"): "train/loss",
    ("epoch", "train_top1"): "train/top1",
    ("epoch", "samples_per_s"): "speed/samples_per_s",
    ("eval", "val_loss"): "val/loss",
    ("eval", "val_top1"): "val/top1",
    ("eval", "val_top5"): "val/top5",
}


class TensorBoardSink:
    """Writes the scalars of known events with torch.utils.tensorboard.SummaryWriter."""

    def __init__(self, run_dir: str, purge_step: Optional[int] = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events a resumed run is about to write again (TensorBoard's own rule).
        self.writer = SummaryWriter(log_dir=os.path.join(run_dir, TENSORBOARD_DIR), purge_step=purge_step)

    def event(self, kind: str, fields: Dict[str, Any]) -> None:
        """Record the scalars of one metrics event at its global step."""
        step = fields.get("step")
        if step is None:
            return
        for (event_kind, name), tag in SCALARS.items():
            value = fields.get(name)
            if event_kind == kind and isinstance(value, (int, float)):
                self.writer.add_scalar(tag, value, global_step=step)
        if kind == "epoch":
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
