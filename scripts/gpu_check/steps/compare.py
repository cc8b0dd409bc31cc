"""Step 6: compare-backends at the GPU count, with DDP and, where there is one, Horovod."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

from ..context import Context
from ..output import one_line
from ..record import StepFailed, StepRecord
from .base import Step
from .horovod import installed
from .training import options


class Compare(Step):
    """The comparison's runs, verdicts and speed."""

    def run(self, ctx: Context, record: StepRecord, until: float) -> None:
        """python -m common.compare with the training of every run; fails where one of its runs failed."""
        found = installed(ctx)
        horovod = asdict(found) if found else None
        backends = "ddp,horovod" if horovod else "ddp"
        record.result["backends"] = backends
        record.result["horovod"] = horovod
        out = ctx.settings.work / "compare"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [ctx.settings.python, "-m", "common.compare", "--np", str(ctx.found.nproc), "--backends", backends,
               *(["--hvd-controllers", "gloo"] if horovod else []), "--repeats", "1", "--noise-floor", "off",
               "--explain", "none", "--out", str(out), "--device", ctx.settings.device, *options(ctx),
               *ctx.settings.forced(record.name)]
        ctx.run(record, cmd, until)
        summary = json.loads((out / "summary.json").read_text())
        record.result["runs"] = [{"name": r["name"], "backend": r["backend"], "world_size": r["world_size"],
                                  "samples_per_s": (r.get("summary") or {}).get("samples_per_s"),
                                  "weights_sha256": (r.get("summary") or {}).get("weights_sha256")}
                                 for r in summary["runs"]]
        record.result["verdicts"] = {f"{row['world_size']}: {column}": cell["text"]
                                     for row in summary["summary"]["rows"] for column, cell in row["cells"].items()}
        record.result["speed"] = summary["summary"]["speed"]
        if summary.get("failures"):
            raise StepFailed(f"a run of the comparison failed: {one_line(json.dumps(summary['failures']))}")
