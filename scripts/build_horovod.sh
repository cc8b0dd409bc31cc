#!/usr/bin/env bash
# Build a Horovod wheel from its PyPI source against the torch in the given interpreter.
#   build_horovod.sh PYTHON VERSION {cpu|nccl} OUT_DIR
# Horovod 0.28.1 (its last release) predates torch 2.14; the patches below are the minimum
# that make it build, each explained where it is applied, and four for horovodrun: its rendezvous
# listens on the address its workers use (loopback for a one-host job), a stopped job's workers get
# the time torchrun gives them to finish a step and write a checkpoint, a stopped job exits non-zero,
# and it starts a job without first importing torch in a process of its own.
set -euo pipefail
PY="$1"; VERSION="$2"; FLAVOUR="$3"; OUT="$4"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

# setup.py imports torch and these at build time, so build without isolation.
"$PY" -m pip install -q packaging psutil pyyaml cloudpickle cffi
"$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK"
tar xzf "horovod-$VERSION.tar.gz"
SRC="$WORK/horovod-$VERSION"

# Horovod's core compiles as C++17 (its vendored gloo already forces 17); torch 2.14's headers
# refuse anything older than C++20, so the torch extension is built as C++20.
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/CMakeLists.txt"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$SRC/horovod/torch/CMakeLists.txt"

# horovodrun's Gloo rendezvous server listens on every interface; its workers reach it at the driver's
# address (127.0.0.1 when every host is this one), so bind it there: a one-host job then listens on
# loopback only. (The elastic driver starts its server before that address is known: unchanged.)
"$PY" - "$SRC" <<'PYEOF'
import pathlib, sys
src = pathlib.Path(sys.argv[1]) / "horovod"
edits = [
    ("runner/util/network.py", "def find_port(server_factory):", "def find_port(server_factory, host=''):"),
    ("runner/util/network.py", "addr = ('', port)", "addr = (host, port)"),
    ("runner/http/http_server.py", "def start(self, handler_cls=RendezvousHandler):",
     "def start(self, handler_cls=RendezvousHandler, host=''):"),
    ("runner/http/http_server.py", "addr, handler_cls, self._verbose))", "addr, handler_cls, self._verbose), host)"),
    ("runner/gloo_run.py", "global_rendezv_port = rendezvous.start()", "global_rendezv_port = rendezvous.start(host=server_ip)"),
    # A stopped horovodrun (Ctrl-C, SIGTERM, a failed worker) sends its workers SIGTERM and kills them 5 s
    # later, less than one step of a large model; 30 s is torchrun's grace. HOROVOD_GRACEFUL_TERMINATION_TIME_S
    # sets another.
    ("runner/common/util/safe_shell_exec.py", "GRACEFUL_TERMINATION_TIME_S = 5",
     "GRACEFUL_TERMINATION_TIME_S = float(os.environ.get('HOROVOD_GRACEFUL_TERMINATION_TIME_S', '30'))"),
    # A worker stopped by horovodrun (Ctrl-C, SIGTERM, another worker failed) is waited for twice: by the thread
    # that stops it (psutil, which reaps it) and by its middleman, whose wait then finds no child and reports 0,
    # so horovodrun could exit 0 after a SIGTERM. A worker stopped that way reports the signal it was sent.
    ("runner/common/util/safe_shell_exec.py", "    exit_code = executor_shell.wait()\n",
     "    exit_code = executor_shell.wait()\n"
     "    if exit_code == 0 and exit_event.is_set():  # its status was reaped by the stopping thread\n"
     "        exit_code = -signal.SIGTERM\n"),
    # Before it starts a job, horovodrun asks whether Horovod has Gloo (or MPI) by forking a process that imports
    # the torch extension, and so torch: 1.5 CPU-s and 1.4 s on a 2-core machine, more than a short job's ranks
    # take to start. This build compiles both into the extension or fails (HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1
    # below), so where the extension is installed the answer is yes without asking.
    ("common/util.py", "\n\ndef _cache(f):\n",
     "\n\ndef _built_here():\n"
     "    # the torch extension of this build, which has Gloo and MPI in it (scripts/build_horovod.sh)\n"
     "    return os.path.exists(get_extension_full_path(os.path.dirname(__file__), 'torch', 'mpi_lib_v2'))\n"
     "\n\ndef _cache(f):\n"),
    ("common/util.py", "def mpi_built(verbose=False):\n",
     "def mpi_built(verbose=False):\n    if _built_here():\n        return True\n"),
    ("common/util.py", "def gloo_built(verbose=False):\n",
     "def gloo_built(verbose=False):\n    if _built_here():\n        return True\n"),
]
for name, old, new in edits:
    path = src / name
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"horovodrun patch: {old!r} not found exactly once in {path}")
    path.write_text(text.replace(old, new))
PYEOF

if [ "$FLAVOUR" = cpu ]; then
    # Horovod builds a CUDA extension whenever torch is a CUDA build and nvcc exists, which then
    # fails to link without a CUDA runtime. With no GPU runtime, keep the extension CPU-only.
    sed -i 's/print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)/print(False)/' \
        "$SRC/cmake/Modules/FindPytorch.cmake"
    grep -q 'print(False)' "$SRC/cmake/Modules/FindPytorch.cmake" || { echo "CPU patch did not apply" >&2; exit 1; }
else
    export HOROVOD_GPU_OPERATIONS=NCCL
fi

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1
# The vendored gloo declares an old cmake_minimum_required that CMake >= 4 rejects.
export CMAKE_POLICY_VERSION_MINIMUM=3.5
export MAKEFLAGS="-j$(nproc)"

mkdir -p "$OUT"
"$PY" -m pip wheel -v --no-deps --no-build-isolation -w "$OUT" "$SRC" > "$WORK/build.log" 2>&1 || {
    tail -n 60 "$WORK/build.log" >&2
    echo "horovod build failed (full log above, last 60 lines)" >&2
    exit 1
}
ls "$OUT"/horovod-*.whl
