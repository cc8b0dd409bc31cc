"""Step 0: the project installed offline (else on PYTHONPATH), then the probe of what the check's python has."""

import json
import os
import shutil
import tomllib
from pathlib import Path

from .context import ROOT, Context, StepFailed, StepRecord, TimedOut, require

PIP = "pip install --no-deps --no-build-isolation -e ."
FALLBACK = "PYTHONPATH (pip could not install: see pip_error)"
#: run in the check's python once the project is installed: versions, the GPUs, what the project's code finds
PROBE = r"""
import json, os, platform, subprocess
from importlib import metadata
import torch
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
def first_line(cmd, **where):
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, **where)
        return done.stdout.split("\n")[0].strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None
cuda = torch.cuda.is_available()
found = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
         "cuda": torch.version.cuda, "cuda_available": cuda, "gpu_count": torch.cuda.device_count() if cuda else 0}
for name in ("torchvision", "numpy", "horovod", "setuptools", "pip", "hvd-ddp-compare"):
    found[name] = version(name)
if cuda:
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    found.update(nccl=".".join(map(str, torch.cuda.nccl.version())), cudnn=torch.backends.cudnn.version(),
                 gpu_names=gpus, gpu_name=gpus[0], gpu_capability="%d%d" % torch.cuda.get_device_capability(0),
                 driver=first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]))
import common, ddp_train, hvd_train
from ddp_train.backend import buffers_not_synced_each_forward
from torch.nn.parallel import DistributedDataParallel
path = os.path.dirname(os.path.dirname(common.__file__))
found["project"] = {"path": path, "git": first_line(["git", "rev-parse", "HEAD"], cwd=path)}
groups = {"loopback": "torchrun.handlers", "launchers": "hvd_ddp_compare.launchers", "apis": "hvd_ddp_compare.apis"}
found["entry_points"] = {key: sorted(e.name for e in metadata.entry_points(group=g)) for key, g in groups.items()}
found["entry_points"]["loopback"] = "loopback" in found["entry_points"]["loopback"]
# where the project's metadata was found: the environment's (pip) or the folder written beside the tree
handlers = [e for e in metadata.entry_points(group="torchrun.handlers") if e.name == "loopback"]
found["metadata"] = os.path.abspath(str(getattr(handlers[0].dist, "_path", ""))) if handlers else None
pin = [r for r in (metadata.requires("hvd-ddp-compare") or []) if r.startswith("torch==")]
keyword = next(iter(buffers_not_synced_each_forward(DistributedDataParallel.__init__)))
synced = keyword == "forward_sync_buffers"
found["compat"] = {"torch_pinned": pin[0].split("==")[1] if pin else None, "torch_here": torch.__version__,
                   "ddp_forward_sync_buffers": synced, "ddp_buffers_keyword": keyword, "notes": [] if synced else [
    "DDP has no forward_sync_buffers in this torch (added in 2.13): ddp_train passes broadcast_buffers=False and "
    "broadcasts the buffers from rank 0 itself at wrap, as DDP does with forward_sync_buffers=False"]}
print(json.dumps(found))
"""


def install(ctx: Context, record: StepRecord, until: float) -> None:
    """pip install -e . offline into the check's python, else the tree on PYTHONPATH with its metadata; the probe."""
    cmd = [ctx.settings.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
           "--disable-pip-version-check", "-e", str(ROOT), *ctx.settings.forced(record.name)]
    try:
        ctx.run(record, cmd, until)
        ctx.install_method = PIP
    except (StepFailed, TimedOut) as exc:
        record.result["pip_error"] = str(exc)
        site = ctx.settings.work / "site"
        write_metadata(site)
        # The metadata first: an egg-info a build left in the tree would be found before it.
        ctx.env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), *filter(None, [ctx.env.get("PYTHONPATH")])])
        ctx.install_method = FALLBACK
        record.commands.append(f"PYTHONPATH={ctx.env['PYTHONPATH']}")
    record.result["method"] = ctx.install_method
    probe(ctx, record, until)


def write_metadata(site: Path) -> None:
    """The project's name, version and entry points (the launchers, loopback) as a dist-info folder in `site`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    shutil.rmtree(site, ignore_errors=True)
    info.mkdir(parents=True)
    requires = "".join(f"Requires-Dist: {r}\n" for r in project.get("dependencies", []))
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
                                   f"{requires}")
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n" for group, items in groups.items()))


def probe(ctx: Context, record: StepRecord, until: float) -> None:
    """The versions, the GPUs and what the project's code finds in the check's python (PROBE); the world size."""
    python, cuda = ctx.settings.python, ctx.settings.device == "cuda"
    output = ctx.run(record, [python, "-c", PROBE], until, shown=f"{python} -c PROBE (scripts/gpu_check/install.py)")
    found = json.loads(output.strip().splitlines()[-1])
    record.result.update({key: found.pop(key) for key in ("project", "entry_points", "metadata")})
    ctx.compat = found.pop("compat")
    ctx.versions.update(found)
    ctx.nproc = int(ctx.settings.nproc_wanted or (found["gpu_count"] if cuda else 2))
    require(record.result["entry_points"].get("loopback"),
            "torchrun's loopback rendezvous is not registered (the project's entry points)")
    require(not cuda or found["cuda_available"], f"torch {found['torch']} sees no CUDA device")
