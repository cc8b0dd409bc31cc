"""What the check's python has, once the project is installed: the versions, the GPUs, what the project's code
finds (its entry points, DDP's keyword for buffers). The install step runs it, also when it is left out."""

from __future__ import annotations

import json

from ..context import Context
from ..record import StepFailed, StepRecord

#: run in the check's python once the project is installed: versions, the GPU, what the project's code finds
PROBE = r"""
import json, os, platform, subprocess, sys
from importlib import metadata
import torch
found = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
         "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
         "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
for name in ("torchvision", "numpy", "horovod", "setuptools", "pip", "hvd-ddp-compare"):
    found[name] = version(name)
if torch.cuda.is_available():
    found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    found["cudnn"] = torch.backends.cudnn.version()
    found["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    found["gpu_name"] = found["gpu_names"][0]
    found["gpu_capability"] = "%d%d" % torch.cuda.get_device_capability(0)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        found["driver"] = smi.stdout.split("\n")[0].strip() or None
    except (OSError, subprocess.TimeoutExpired):
        found["driver"] = None
import common, ddp_train, hvd_train
from ddp_train.backend import buffers_not_synced_each_forward
from torch.nn.parallel import DistributedDataParallel
found["project"] = {"path": os.path.dirname(os.path.dirname(common.__file__))}
try:
    found["project"]["git"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                             cwd=found["project"]["path"], timeout=30).stdout.strip() or None
except OSError:
    found["project"]["git"] = None
groups = {"loopback": "torchrun.handlers", "launchers": "hvd_ddp_compare.launchers", "apis": "hvd_ddp_compare.apis"}
found["entry_points"] = {key: sorted(e.name for e in metadata.entry_points(group=group))
                         for key, group in groups.items()}
found["entry_points"]["loopback"] = "loopback" in found["entry_points"]["loopback"]
# where the project's metadata was found: the environment's (pip) or the folder written beside the tree
handlers = [e for e in metadata.entry_points(group="torchrun.handlers") if e.name == "loopback"]
found["metadata"] = os.path.abspath(str(getattr(handlers[0].dist, "_path", ""))) if handlers else None
pin = [r for r in (metadata.requires("hvd-ddp-compare") or []) if r.startswith("torch==")]
keyword = next(iter(buffers_not_synced_each_forward(DistributedDataParallel.__init__)))
found["compat"] = {
    "torch_pinned": pin[0].split("==")[1] if pin else None, "torch_here": torch.__version__,
    "ddp_forward_sync_buffers": keyword == "forward_sync_buffers",
    "ddp_buffers_keyword": keyword,
    "notes": [] if keyword == "forward_sync_buffers" else [
        "DDP has no forward_sync_buffers in this torch (added in 2.13): ddp_train passes broadcast_buffers=False and "
        "broadcasts the buffers from rank 0 itself at wrap, as DDP does with forward_sync_buffers=False"]}
print(json.dumps(found))
"""


def probe(ctx: Context, record: StepRecord, until: float) -> None:
    """The versions, the GPUs and what the project's code finds in the check's python (PROBE); the world size."""
    python = ctx.settings.python
    output = ctx.run(record, [python, "-c", PROBE], until,
                     shown=f"{python} -c PROBE (scripts/gpu_check/steps/probe.py)")
    found = json.loads(output.strip().splitlines()[-1])
    record.result["project"] = found.pop("project")
    record.result["entry_points"] = found.pop("entry_points")
    record.result["metadata"] = found.pop("metadata")
    ctx.found.compat = found.pop("compat")
    ctx.found.versions.update(found)
    cuda = ctx.settings.device == "cuda"
    ctx.found.nproc = int(ctx.settings.nproc_wanted or (found["gpu_count"] if cuda else 2))
    if not record.result["entry_points"].get("loopback"):
        raise StepFailed("torchrun's loopback rendezvous is not registered (the project's entry points)")
    if cuda and not found["cuda_available"]:
        raise StepFailed(f"torch {found['torch']} sees no CUDA device")
