#!/usr/bin/env bash
# One-time, idempotent set-up of everything the project needs on a new machine:
# system packages (OpenMPI, cmake, g++), the .venv with the project installed editable,
# and Horovod 0.28.1 built from source against the pinned torch (wheel cached outside the repo).
# A second call checks each step and skips it in seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
HOROVOD_VERSION="0.28.1"
# Raised whenever scripts/build_horovod.sh changes what it builds, so that a cached wheel of an older
# build is not reused.
BUILD_REVISION="5"
CACHE_DIR="${HVD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd-ddp-compare/wheels}"

# pip here warns about every configured local index folder it cannot find; hide only those lines.
quiet_pip() { "$PY" -m pip "$@" 2> >(grep -v "^WARNING: Location .* is ignored" >&2); }
# uv installs the dependencies: it links them from its cache (~/.cache/uv) where pip would unpack about 6 GB of
# wheels (torch and its CUDA libraries) again for every new .venv, which takes minutes.
UV="$VENV/bin/uv"
uv_install() { "$UV" pip install -q --python "$PY" "$@"; }

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# --- 1. system packages --------------------------------------------------------------------
# openssh-server, openssh-client and iproute2: the simulated two-host cluster of the multinode tests
# (network namespaces, each running its own sshd) and the launch doctor's ssh checks. munge, slurmctld,
# slurmd and slurm-client: Slurm on that cluster (tests/slurm_cluster.py). chromium: the browser the tests open
# report.html in (tests/browser.py, through Playwright).
SYSTEM_PACKAGES=(openmpi-bin libopenmpi-dev cmake g++ make openssh-server openssh-client iproute2
                 munge slurmctld slurmd slurm-client chromium)
# pyspark 4 (horovod.spark.run on TorchDistributor) runs on Java 17 or 21: Debian's JRE only where no such java is
# on PATH already.
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1; }
major="$(command -v java >/dev/null && java_major || true)"
if [ "${major:-0}" != 17 ] && [ "${major:-0}" != 21 ]; then
    SYSTEM_PACKAGES+=(openjdk-17-jre-headless)
fi
missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing system packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
else
    log "system packages present"
fi

# --- 2. virtual environment with the project -------------------------------------------------
STAMP="$VENV/.project-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -x "$PY" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    log "installing the project and its pinned dependencies into .venv (torch is large: minutes the first time)"
    quiet_pip install -q "uv==0.13.*"
    # uv reads its own settings, not pip's: where pip is given a package index (a mirror), uv takes the same one.
    index="${PIP_INDEX_URL:-$("$PY" -m pip config get global.index-url 2>/dev/null || true)}"
    if [ -n "$index" ]; then export UV_DEFAULT_INDEX="$index"; fi
    # Horovod's build imports torch and these, so they must be there first (no build isolation). Bytecode is
    # compiled here, once: every rank of every run imports torch.
    uv_install --compile-bytecode setuptools wheel -e "$ROOT[test]"
    echo "$want" > "$STAMP"
else
    log "project already installed in .venv"
fi

# --- 3. Horovod, built from source against this torch -----------------------------------------
have_cuda_runtime() {
    # nvcc alone is not enough: torch must be able to reach a GPU through the CUDA runtime.
    "$PY" - <<'PYEOF' 2>/dev/null
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
PYEOF
}

horovod_ok() {
    "$PY" - <<'PYEOF' 2>/dev/null
import sys
import horovod, horovod.torch as hvd
import inspect
from horovod.runner.util.network import find_port
from horovod.runner.common.util import safe_shell_exec
from horovod.common import util
# build revision 2: horovodrun's rendezvous binds to the driver's address; 3: its workers get 30 s to stop;
# 4: a stopped worker reports its signal; 5: horovodrun knows what the build has without importing torch
# (scripts/build_horovod.sh)
source = inspect.getsource(safe_shell_exec)
patched = "host" in inspect.signature(find_port).parameters and \
    "HOROVOD_GRACEFUL_TERMINATION_TIME_S" in source and "reaped by the stopping thread" in source and \
    hasattr(util, "_built_here") and util._built_here()
ok = horovod.__version__ == "0.28.1" and hvd.gloo_built() and hvd.mpi_built() and patched
sys.exit(0 if ok else 1)
PYEOF
}

if horovod_ok; then
    log "horovod $HOROVOD_VERSION present"
else
    TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
    PYTAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
    if have_cuda_runtime; then FLAVOUR=nccl; else FLAVOUR=cpu; fi
    WHEEL_DIR="$CACHE_DIR/horovod-$HOROVOD_VERSION-r$BUILD_REVISION-torch$TORCH_VERSION-$PYTAG-$FLAVOUR"
    wheel="$(ls "$WHEEL_DIR"/horovod-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$wheel" ]; then
        log "building horovod $HOROVOD_VERSION for torch $TORCH_VERSION ($FLAVOUR); about 5 minutes on 2 cores"
        bash "$ROOT/scripts/build_horovod.sh" "$PY" "$HOROVOD_VERSION" "$FLAVOUR" "$WHEEL_DIR"
        wheel="$(ls "$WHEEL_DIR"/horovod-*.whl 2>/dev/null | head -n1 || true)"
        [ -n "$wheel" ] || die "horovod build produced no wheel; see the log above"
    else
        log "reusing cached wheel $wheel"
    fi
    uv_install --no-deps --reinstall --compile-bytecode "$wheel"
fi

# --- 4. the build must have PyTorch, Gloo and MPI ---------------------------------------------
check="$("$VENV/bin/horovodrun" --check-build 2>&1)" || die "horovodrun --check-build failed: $check"
for want_line in "\[X\] PyTorch" "\[X\] MPI" "\[X\] Gloo"; do
    if ! grep -q "$want_line" <<<"$check"; then
        echo "$check" >&2
        die "Horovod was built without ${want_line#\\[X\\] }; delete $CACHE_DIR and run 'make setup' again"
    fi
done
log "horovodrun --check-build: PyTorch, MPI and Gloo available"

# --- 5. Slurm: the MPI plugin Horovod's sbatch template uses -------------------------------------
# tests/slurm_cluster.py makes its own slurm.conf and munge key and starts the daemons; what must come with the
# packages is PMIx in both Slurm's build and Open MPI's (slurm/hvd_srun.sbatch runs srun --mpi=pmix).
slurm="$(slurmd -V 2>&1)" || die "slurmd does not run: $slurm"
slurm_plugins="$(dpkg -L slurm-wlm-basic-plugins | grep '/mpi_none\.so$' | head -n1 | xargs dirname)"
[ -e "$slurm_plugins/mpi_pmix.so" ] || die "$slurm has no PMIx plugin ($slurm_plugins/mpi_pmix.so)"
ompi_info --parsable 2>/dev/null | grep -q '^mca:pmix:ext' \
    || die "Open MPI ($(command -v mpirun)) has no PMIx client (ompi_info lists no pmix ext component)"
log "$slurm: srun --mpi=pmix, which Open MPI speaks too"

# --- 6. bytecode of the project's own modules ---------------------------------------------------
# Every rank, launcher and comparison imports them. Where PYTHONDONTWRITEBYTECODE is set, no process writes
# their .pyc, so each would compile them again; written here once (up-to-date files are skipped).
"$PY" -m compileall -q -j 0 "$ROOT/common" "$ROOT/ddp_train" "$ROOT/hvd_train" "$ROOT/benchmarks" >/dev/null \
    || die "compiling the project's modules failed"
log "ready: source .venv/bin/activate"
