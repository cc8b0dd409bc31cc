"""Steps 4 to 6: the Horovod API, Horovod built offline in the background, the comparison with DDP (and Horovod)."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .context import ROOT, Context, Launch, Skipped, StepFailed, StepRecord, one_line, require
from .training import NCCL_VERSION, options, torchrun

HOROVOD_VERSION = "0.28.1"
#: the Horovod-style script and its arguments
HVD_SCRIPT = "examples/gpu/train_horovod.py"
HVD_ARGS = {"cuda": ["--model", "resnet18", "--batch-size", "64", "--num-iters", "5"],
            "cpu": ["--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--num-warmup-batches", "1",
                    "--num-batches-per-iter", "1", "--num-iters", "2", "--no-cuda"]}
#: CUDA toolkits, after $CUDA_HOME, before the folder above PATH's nvcc (which may be a wrapper outside a toolkit)
CUDA_ROOTS = [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]


def installed(ctx: Context) -> dict[str, Any] | None:
    """The Horovod that `import horovod.torch` finds in the check's python: its version, what it was built with."""
    code = ("import json, horovod, horovod.torch as hvd; print(json.dumps({'version': horovod.__version__, "
            "'nccl_built': int(hvd.nccl_built()), 'gloo_built': bool(hvd.gloo_built()), "
            "'mpi_built': bool(hvd.mpi_built())}))")
    found = subprocess.run([ctx.settings.python, "-c", code], capture_output=True, text=True, env=ctx.env, cwd=ROOT,
                           timeout=120)
    return dict(json.loads(found.stdout.strip().splitlines()[-1])) if found.returncode == 0 else None


def horovod_api(ctx: Context, record: StepRecord, until: float) -> None:
    """Step 4: HVD_SCRIPT under torchrun -m ddp_train.horovod_api; what it wrote (--result) recorded and checked."""
    cuda, nproc, out = ctx.settings.device == "cuda", ctx.nproc, ctx.settings.work / "horovod_api"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    output = ctx.run(record, torchrun(ctx, nproc, ["-m", "ddp_train.horovod_api", HVD_SCRIPT,
                                                   *HVD_ARGS[ctx.settings.device], "--result", str(out / "result.json"),
                                                   *ctx.settings.forced(record.name)]), until)
    try:
        result = json.loads((out / "result.json").read_text())
    except (OSError, ValueError) as exc:
        raise StepFailed(f"{HVD_SCRIPT} wrote no result ({exc})") from None
    nccl = NCCL_VERSION.findall(output)
    record.result.update(result, nccl=nccl[0] if nccl else None)
    require(result["size"] == nproc, f"hvd.size() is {result['size']}, not {nproc}")
    for worker in result["workers"]:
        on = f"cuda:{worker['local_rank']}" if cuda else "cpu"
        require(worker["device"] == on, f"worker {worker['rank']} trained on {worker['device']}, not {on}")
    require(result["allreduce_sum"] == result["allreduce_sum_expected"], f"hvd.allreduce(rank, op=hvd.Sum) gave "
            f"{result['allreduce_sum']}, not {result['allreduce_sum_expected']}")
    require(result["weights_equal"], "the workers ended with different weights")
    require(result["losses_finite"], "a loss is not finite")
    require(not cuda or (result["nccl_built"] and nccl),
            "CUDA tensors did not travel on NCCL (hvd.nccl_built() 0 or no 'NCCL version' line)")


def compare(ctx: Context, record: StepRecord, until: float) -> None:
    """Step 6: python -m common.compare at the GPU count, with Horovod where one is installed; its runs and verdicts."""
    horovod, out = installed(ctx), ctx.settings.work / "compare"
    backends = "ddp,horovod" if horovod else "ddp"
    record.result.update(backends=backends, horovod=horovod)
    shutil.rmtree(out, ignore_errors=True)
    ctx.run(record, [ctx.settings.python, "-m", "common.compare", "--np", str(ctx.nproc), "--backends", backends,
                     *(["--hvd-controllers", "gloo"] if horovod else []), "--repeats", "1", "--noise-floor", "off",
                     "--explain", "none", "--out", str(out), "--device", ctx.settings.device, *options(ctx),
                     *ctx.settings.forced(record.name)], until)
    summary = json.loads((out / "summary.json").read_text())
    record.result["runs"] = [{"name": r["name"], "backend": r["backend"], "world_size": r["world_size"],
                              "samples_per_s": (r.get("summary") or {}).get("samples_per_s"),
                              "weights_sha256": (r.get("summary") or {}).get("weights_sha256")}
                             for r in summary["runs"]]
    record.result["verdicts"] = {f"{row['world_size']}: {column}": cell["text"]
                                 for row in summary["summary"]["rows"] for column, cell in row["cells"].items()}
    record.result["speed"] = summary["summary"]["speed"]
    require(not summary.get("failures"),
            f"a run of the comparison failed: {one_line(json.dumps(summary.get('failures')))}")


def prepare_build(ctx: Context, record: StepRecord) -> Launch:
    """Step 5's command: build_horovod.sh from the carried source, offline, then horovodrun --check-build."""
    settings, cuda, found = ctx.settings, ctx.settings.device == "cuda", installed(ctx)
    wanted = settings.build_wanted if settings.build_wanted != "auto" else "1" if cuda else "0"
    if found and (not cuda or found["nccl_built"]) and wanted != "1":
        record.result["installed"] = found
        raise Skipped(f"Horovod {found['version']} is installed already (not rebuilt)")
    if wanted != "1":
        raise Skipped("the rehearsal does not build Horovod (GPU_CHECK_HOROVOD_BUILD=1 does)")
    needs = record.result["prerequisites"] = build_needs(ctx)
    if needs["missing"]:
        raise Skipped(f"cannot build here: no {', '.join(needs['missing'])}"
                      + (f" (the source is carried in {settings.carry}: docs/gpu-check.md#carry)"
                         if "sdist" in needs["missing"] else ""))
    wheels = settings.work / "horovod-wheel"
    shutil.rmtree(wheels, ignore_errors=True)
    # Offline: pip finds the source and cffi in the carried folder, and builds without an isolated environment
    env = {**ctx.env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(settings.carry), "PIP_NO_BUILD_ISOLATION": "0",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if not needs["mpi"]:
        env["HOROVOD_WITHOUT_MPI"] = "1"  # no MPI on the machine: the Gloo controller alone
        record.result["note"] = ("built without MPI: horovodrun --check-build lists MPI all the same, since "
                                 "build_horovod.sh answers yes for both controllers of its builds")
    if cuda:  # nothing is missing by now
        links = settings.work / "nccl-lib"  # the wheel has libnccl.so.2 only; CMake looks for libnccl.so
        shutil.rmtree(links, ignore_errors=True)
        links.mkdir(parents=True)
        (links / "libnccl.so").symlink_to(needs["nccl_lib"])
        home = needs["cuda_home"]
        env.update({"HOROVOD_NCCL_INCLUDE": needs["nccl_include"], "HOROVOD_NCCL_LIB": str(links),
                    "HOROVOD_NCCL_LINK": "SHARED",
                    # The toolkit for CMake (nvcc, headers, cudart), torch's extension builder and Horovod.
                    "CUDA_HOME": home, "CUDAToolkit_ROOT": home, "HOROVOD_CUDA_HOME": home,
                    "PATH": f"{Path(home, 'bin')}{os.pathsep}{env.get('PATH', '')}"})
        if ctx.versions.get("gpu_capability"):  # this GPU's only: nvcc builds one architecture
            env["HOROVOD_BUILD_CUDA_CC_LIST"] = ctx.versions["gpu_capability"]
    python = settings.python
    script = (f"bash scripts/build_horovod.sh {python} {HOROVOD_VERSION} {'nccl' if cuda else 'cpu'} {wheels} && "
              f"{python} -m pip install --no-deps --no-index --force-reinstall {wheels}/horovod-*.whl && "
              f"{python} -m horovod.runner.launch --check-build")  # horovodrun
    # On every core (build_horovod.sh's make -j), below the training runs beside it in priority.
    return Launch(["nice", "-n", "10", "bash", "-c", script], shown=script, env=env)


def build_finished(ctx: Context, record: StepRecord, output: str) -> None:
    """horovodrun --check-build's lines, and the Horovod now installed."""
    record.result["check_build"] = [line.strip() for line in output.splitlines() if re.match(r"\s*\[[X ]\]", line)]
    record.result["installed"] = installed(ctx)


def build_needs(ctx: Context) -> dict[str, Any]:
    """What building Horovod here needs, found or not (`missing`); NCCL the nvidia-nccl wheel's, else the system's."""
    nvcc, sdist = shutil.which("nvcc"), ctx.settings.carry / f"horovod-{HOROVOD_VERSION}.tar.gz"
    roots = ([Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []) + CUDA_ROOTS + (
        [Path(nvcc).resolve().parents[1]] if nvcc else [])
    cuda_home = next((str(root) for root in roots if (root / "bin" / "nvcc").exists() and any(
        (root / sub / "cuda_runtime.h").exists() for sub in ("include", "targets/x86_64-linux/include"))), None)
    found = {"sdist": str(sdist) if sdist.exists() else None, "cmake": shutil.which("cmake"),
             "cxx": shutil.which("c++") or shutil.which("g++"), "cuda_home": cuda_home, "mpi": shutil.which("mpicc")}
    needed = ["sdist", "cmake", "cxx"]
    if ctx.settings.device == "cuda":
        code = "import nvidia.nccl as n, json; print(json.dumps(list(n.__path__)[0]))"
        wheel = subprocess.run([ctx.settings.python, "-c", code], capture_output=True, text=True, env=ctx.env,
                               timeout=60)
        found["nccl_include"] = found["nccl_lib"] = None
        for home in ([json.loads(wheel.stdout)] if wheel.returncode == 0 else []) + ["/usr", "/usr/local/cuda"]:
            if not found["nccl_include"] and Path(home, "include", "nccl.h").exists():
                found["nccl_include"] = str(Path(home, "include"))
            for folder in ("lib", "lib64", "lib/x86_64-linux-gnu"):
                libs = map(str, Path(home, folder).glob("libnccl.so*"))
                found["nccl_lib"] = found["nccl_lib"] or min(libs, default=None)
        needed += ["cuda_home", "nccl_include", "nccl_lib"]
    return {**found, "missing": [what for what in needed if not found[what]]}
