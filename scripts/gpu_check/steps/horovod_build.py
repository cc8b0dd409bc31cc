"""Step 5: Horovod built with NCCL and the Gloo controller from the carried source, offline, and installed into
the check's python; in the background, beside the steps after ddp."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..context import Context
from ..record import Skipped, StepRecord
from .base import BackgroundStep, Launch
from .horovod import HOROVOD_VERSION, installed

#: where a CUDA toolkit may be, after $CUDA_HOME and before the one of the nvcc on PATH (which may be a wrapper
#: script outside the toolkit)
CUDA_ROOTS = [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]


@dataclass(frozen=True)
class NcclPaths:
    """NCCL's header folder and library."""

    include: str | None
    lib: str | None


@dataclass(frozen=True)
class Prerequisites:
    """What building Horovod here needs, found or not."""

    sdist: str | None
    cmake: str | None
    cxx: str | None
    cuda_home: str | None
    mpi: str | None
    nccl: NcclPaths | None  # looked for on a GPU machine only
    missing: list[str]

    def json(self) -> dict[str, Any]:
        """As the record has it: NCCL's paths only where they were looked for."""
        found: dict[str, Any] = {"sdist": self.sdist, "cmake": self.cmake, "cxx": self.cxx,
                                 "cuda_home": self.cuda_home, "mpi": self.mpi}
        if self.nccl is not None:
            found.update({"nccl_include": self.nccl.include, "nccl_lib": self.nccl.lib})
        found["missing"] = self.missing
        return found


class HorovodBuild(BackgroundStep):
    """Horovod 0.28.1 builds against the machine's torch and NCCL; where it cannot, the reason."""

    def prepare(self, ctx: Context, record: StepRecord) -> Launch:
        """Build Horovod (scripts/build_horovod.sh: NCCL on a GPU, the Gloo controller) from the carried source,
        offline, then install it into the check's python and run horovodrun --check-build."""
        settings, cuda = ctx.settings, ctx.settings.device == "cuda"
        python = settings.python
        found_installed = installed(ctx)
        wanted = settings.build_wanted
        if wanted == "auto":
            wanted = "1" if cuda else "0"
        if found_installed and (not cuda or found_installed.nccl_built) and wanted != "1":
            record.result["installed"] = asdict(found_installed)
            raise Skipped(f"Horovod {found_installed.version} is installed already (not rebuilt)")
        if wanted != "1":
            raise Skipped("the rehearsal does not build Horovod (GPU_CHECK_HOROVOD_BUILD=1 does)")
        found = prerequisites(ctx)
        record.result["prerequisites"] = found.json()
        if found.missing:
            raise Skipped(f"cannot build here: no {', '.join(found.missing)}"
                          + (f" (the source is carried in {settings.carry}: docs/gpu-check.md#carry)"
                             if "sdist" in found.missing else ""))
        flavour = "nccl" if cuda else "cpu"
        wheels = settings.work / "horovod-wheel"
        shutil.rmtree(wheels, ignore_errors=True)
        env = dict(ctx.env)
        # Offline: build_horovod.sh's pip finds the source and cffi in the carried folder, and builds without an
        # isolated environment (which pip would fill from an index).
        env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(settings.carry), "PIP_NO_BUILD_ISOLATION": "0",
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        if not found.mpi:
            env["HOROVOD_WITHOUT_MPI"] = "1"  # no MPI on the machine: the Gloo controller alone
            record.result["note"] = ("built without MPI: horovodrun --check-build lists MPI all the same, since "
                                     "build_horovod.sh answers yes for both controllers of its builds")
        nccl = found.nccl
        if cuda and nccl and nccl.include and nccl.lib and found.cuda_home:  # on a GPU nothing is missing by now
            links = settings.work / "nccl-lib"  # the wheel has libnccl.so.2 only; CMake looks for libnccl.so
            shutil.rmtree(links, ignore_errors=True)
            links.mkdir(parents=True)
            (links / "libnccl.so").symlink_to(nccl.lib)
            env.update({"HOROVOD_NCCL_INCLUDE": nccl.include, "HOROVOD_NCCL_LIB": str(links),
                        "HOROVOD_NCCL_LINK": "SHARED",
                        # The toolkit for CMake (nvcc, headers, cudart), torch's extension builder and Horovod.
                        "CUDA_HOME": found.cuda_home, "CUDAToolkit_ROOT": found.cuda_home,
                        "HOROVOD_CUDA_HOME": found.cuda_home,
                        "PATH": f"{Path(found.cuda_home, 'bin')}{os.pathsep}{env.get('PATH', '')}"})
            capability = ctx.found.versions.get("gpu_capability")
            if capability:
                env["HOROVOD_BUILD_CUDA_CC_LIST"] = capability  # this GPU's only: nvcc builds one architecture
        script = (f"bash scripts/build_horovod.sh {python} {HOROVOD_VERSION} {flavour} {wheels} && "
                  f"{python} -m pip install --no-deps --no-index --force-reinstall {wheels}/horovod-*.whl && "
                  f"{python} -m horovod.runner.launch --check-build")  # horovodrun
        # On every core (build_horovod.sh's make -j), below the training runs beside it in priority.
        return Launch(["nice", "-n", "10", "bash", "-c", script], shown=script, env=env)

    def finished(self, ctx: Context, record: StepRecord, output: str) -> None:
        """horovodrun --check-build's lines, and the Horovod now installed."""
        record.result["check_build"] = [line.strip() for line in output.splitlines()
                                        if re.match(r"\s*\[[X ]\]", line)]
        found = installed(ctx)
        record.result["installed"] = asdict(found) if found else None


def prerequisites(ctx: Context) -> Prerequisites:
    """What building Horovod here needs, found or not: its source, compilers, NCCL's headers and library."""
    cuda = ctx.settings.device == "cuda"
    sdist = ctx.settings.carry / f"horovod-{HOROVOD_VERSION}.tar.gz"
    nccl = nccl_paths(ctx) if cuda else None
    found = {"sdist": str(sdist) if sdist.exists() else None, "cmake": shutil.which("cmake"),
             "cxx": shutil.which("c++") or shutil.which("g++"), "cuda_home": cuda_home()}
    missing = [what for what in ("sdist", "cmake", "cxx") if not found[what]]
    if nccl is not None:
        missing += [what for what, value in (("cuda_home", found["cuda_home"]), ("nccl_include", nccl.include),
                                             ("nccl_lib", nccl.lib)) if not value]
    return Prerequisites(sdist=found["sdist"], cmake=found["cmake"], cxx=found["cxx"], cuda_home=found["cuda_home"],
                         mpi=shutil.which("mpicc"), nccl=nccl, missing=missing)


def nccl_paths(ctx: Context) -> NcclPaths:
    """NCCL's header and library: those of the nvidia-nccl wheel torch uses, else the system's."""
    code = ("import json, os\ntry:\n    import nvidia.nccl as n; d = list(n.__path__)[0]\nexcept ImportError:\n"
            "    d = None\nprint(json.dumps(d))")
    found = subprocess.run([ctx.settings.python, "-c", code], capture_output=True, text=True, env=ctx.env,
                           timeout=60)
    home = json.loads(found.stdout.strip() or "null") if found.returncode == 0 else None
    include = lib = None
    for candidate in ([home] if home else []) + ["/usr", "/usr/local/cuda"]:
        if not include and Path(candidate, "include", "nccl.h").exists():
            include = str(Path(candidate, "include"))
        for libdir in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            libs = sorted(Path(candidate, libdir).glob("libnccl.so*")) if Path(candidate, libdir).is_dir() else []
            if not lib and libs:
                lib = str(libs[0])
    return NcclPaths(include, lib)


def cuda_home() -> str | None:
    """The CUDA toolkit to build with: a folder with bin/nvcc and cuda_runtime.h ($CUDA_HOME, /usr/local/cuda,
    /usr/local/cuda-*, the one above the nvcc on PATH)."""
    nvcc = shutil.which("nvcc")
    candidates = ([Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []) + CUDA_ROOTS + (
        [Path(nvcc).resolve().parents[1]] if nvcc else [])
    for root in candidates:
        headers = [root / "include", root / "targets" / "x86_64-linux" / "include"]
        if (root / "bin" / "nvcc").exists() and any((h / "cuda_runtime.h").exists() for h in headers):
            return str(root)
    return None
