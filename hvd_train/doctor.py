"""The launch doctor's Horovod checks (registered under the entry-point group hvd_ddp_compare.doctor):
Horovod's build, mpi4py against mpirun, and a short allreduce across the hosts through horovodrun.

    python -m hvd_train.doctor    # one rank of the allreduce probe, as horovodrun starts it
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from typing import List, Optional, Tuple

from common.doctor import Check, Probe, run_command

PROBE_TIMEOUT_S = 90
PROBE_MB = 4
PROBE_REPEATS = 5
PROBE_TAG = "doctor-probe"

_HOROVOD_BUILD = """
import json
from hvd_train.backend import import_horovod
hvd = import_horovod()
import horovod
print(json.dumps({"version": horovod.__version__, "gloo": bool(hvd.gloo_built()),
                  "mpi": bool(hvd.mpi_built()), "nccl": bool(hvd.nccl_built())}))
"""


def check_horovod_build() -> Check:
    """horovod.torch imports against this torch and was built with Gloo and MPI."""
    name = "horovod build"
    code, out = run_command([sys.executable, "-c", _HOROVOD_BUILD], timeout=60)
    rebuild = "run `make setup`, which builds horovod 0.28.1 against this torch with HOROVOD_WITH_PYTORCH=1 " \
              "HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1"
    if code != 0:
        return Check(name, False, f"horovod.torch does not load: {out.splitlines()[-1] if out else code}", rebuild)
    built = json.loads(out.splitlines()[-1])
    parts = ["PyTorch"] + [label for key, label in (("gloo", "Gloo"), ("mpi", "MPI"), ("nccl", "NCCL")) if built[key]]
    missing = [label for key, label in (("gloo", "Gloo"), ("mpi", "MPI")) if not built[key]]
    if missing:
        return Check(name, False, f"horovod {built['version']} built without {', '.join(missing)}", rebuild)
    return Check(name, True, f"horovod {built['version']} with {', '.join(parts)}")


_MPI4PY_LIBRARY = """
import mpi4py
mpi4py.rc.initialize = False  # the version is known without starting MPI
from mpi4py import MPI
print(MPI.Get_library_version().strip().strip(chr(0)).splitlines()[0])
"""


def mpi_identity(text: str) -> Tuple[Optional[str], Optional[str]]:
    """(vendor, version) from `mpirun --version` or MPI_Get_library_version text."""
    patterns = (("Open MPI", r"Open MPI\)?\s+v?(\d+(?:\.\d+)+)"), ("MPICH", r"MPICH.*?Version:\s*(\S+)"),
                ("MPICH", r"HYDRA.*?Version:\s*(\S+)"), ("Intel MPI", r"Intel\(R\) MPI Library\D*(\d+(?:\.\d+)*)"))
    for vendor, pattern in patterns:
        m = re.search(pattern, text, re.S)
        if m:
            return vendor, m.group(1)
    return None, None


def check_mpi() -> Check:
    """mpi4py loads the same MPI (vendor and version) as the mpirun on PATH."""
    name = "mpi4py vs mpirun"
    if not shutil.which("mpirun"):
        return Check(name, False, "mpirun is not on PATH",
                     "install OpenMPI (apt-get install openmpi-bin libopenmpi-dev) or put your MPI's bin/ on PATH")
    code, mpirun_text = run_command(["mpirun", "--version"], timeout=20)
    code4py, lib_text = run_command([sys.executable, "-c", _MPI4PY_LIBRARY], timeout=30)
    if code4py != 0:
        return Check(name, False, f"mpi4py does not load: {lib_text.splitlines()[-1] if lib_text else code4py}",
                     "pip install mpi4py (it must find the libmpi of the mpirun you launch with)")
    run_vendor, run_version = mpi_identity(mpirun_text)
    lib_vendor, lib_version = mpi_identity(lib_text)
    mpirun_path = shutil.which("mpirun")
    if (run_vendor, run_version) != (lib_vendor, lib_version) or run_vendor is None:
        return Check(name, False, f"mpi4py uses {lib_text!r} but {mpirun_path} is "
                                  f"{mpirun_text.splitlines()[0] if mpirun_text else 'unknown'!r}",
                     "put the MPI that mpi4py and Horovod were built with first on PATH and LD_LIBRARY_PATH, or "
                     "rebuild mpi4py against this one: pip install --force-reinstall --no-binary mpi4py mpi4py")
    return Check(name, True, f"both {run_vendor} {run_version} ({mpirun_path})")


# --- allreduce between the hosts -------------------------------------------------------------
def probe_hosts(hosts: List[Tuple[str, int]]) -> List[Tuple[str, int]]:
    """One process per host (the traffic between hosts is what is measured); two on a single host."""
    return [(h, 1) for h, _ in hosts] if len(hosts) > 1 else [(hosts[0][0], 2)]


def probe_command(hosts: List[Tuple[str, int]], ssh_port: Optional[int], identity: Optional[str],
                  iface: Optional[str]) -> List[str]:
    """horovodrun over Gloo, starting `python -m hvd_train.doctor` on every host."""
    from common.launch import get

    np = sum(slots for _, slots in hosts)
    cmd = get("horovodrun-gloo").command(np, module="hvd_train.doctor", hosts=",".join(f"{h}:{s}" for h, s in hosts))
    options = ["--start-timeout", "60", "--disable-cache"]
    if ssh_port:
        options += ["--ssh-port", str(ssh_port)]
    if identity:
        options += ["--ssh-identity-file", identity]
    if iface:
        options += ["--network-interface", iface]
    return cmd[:1] + options + cmd[1:]


def check_allreduce(hosts: List[Tuple[str, int]], ssh_port: Optional[int], identity: Optional[str],
                    iface: Optional[str]) -> Check:
    """A few allreduces of a few MB across the hosts through horovodrun; their bandwidth."""
    hosts = probe_hosts(hosts)
    name = "allreduce"
    cmd = probe_command(hosts, ssh_port, identity, iface)
    env = dict(os.environ, PYTHONUNBUFFERED="1", HOROVOD_GLOO_TIMEOUT_SECONDS="60")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    started = time.monotonic()
    code, out = run_command(cmd, timeout=PROBE_TIMEOUT_S, env=env)
    seconds = time.monotonic() - started
    result = None
    for line in out.splitlines():
        if PROBE_TAG in line:
            result = json.loads(line.split(PROBE_TAG, 1)[1])
    if code != 0 or result is None:
        last = [line for line in out.splitlines() if line.strip()][-3:]
        return Check(name, False, f"`{' '.join(cmd[:6])} ...` failed (exit {code} after {seconds:.0f} s): "
                                  f"{' | '.join(last) or 'no output'}",
                     "fix the failures above first; then run the probe command by hand to see its full output")
    where = ", ".join(h for h, _ in hosts)
    if not result["correct"]:
        return Check(name, False, f"allreduce over {where} returned a wrong sum",
                     "a broken network path or mismatched Horovod builds on the hosts: reinstall with `make setup` "
                     "on every host")
    return Check(name, True, f"{result['mb']:.0f} MB x {result['repeats']} over {result['size']} processes on {where}: "
                             f"{result['busbw_gbs']:.2f} GB/s bus bandwidth, {result['ms']:.1f} ms each "
                             f"(whole probe {seconds:.0f} s)")


def allreduce_probe() -> int:
    """Run as a Horovod worker: time allreduces of PROBE_MB and print the result on rank 0."""
    import torch

    from .backend import HorovodBackend

    torch.set_num_threads(1)
    backend = HorovodBackend()
    backend.check_environment()
    backend.select_device("cpu")  # the probe's tensors live on CPU: it measures the network between hosts
    backend.init(timeout_s=60)
    hvd = backend.hvd
    size = hvd.size()
    tensor = torch.ones(PROBE_MB * 1024 * 1024 // 4)
    hvd.allreduce(tensor, op=hvd.Sum, name="doctor.warmup")
    times = []
    for i in range(PROBE_REPEATS):
        started = time.perf_counter()
        out = hvd.allreduce(tensor, op=hvd.Sum, name=f"doctor.{i}")
        times.append(time.perf_counter() - started)
    correct = bool(torch.all(out == size))
    if hvd.rank() == 0:
        seconds = sorted(times)[len(times) // 2]
        nbytes = tensor.numel() * 4
        # nccl-tests' bus bandwidth: what each link carries in a ring allreduce, comparable to link speed.
        busbw = 2 * (size - 1) / size * nbytes / seconds / 1e9
        print(PROBE_TAG + " " + json.dumps({"size": size, "mb": nbytes / 2**20, "repeats": PROBE_REPEATS,
                                            "ms": seconds * 1e3, "busbw_gbs": busbw, "correct": correct}),
              flush=True)
    backend.shutdown()
    return 0 if correct else 1


CHECKS = [check_horovod_build, check_mpi]
PROBES = [Probe("allreduce", check_allreduce)]

if __name__ == "__main__":
    sys.exit(allreduce_probe())
