#!/usr/bin/env bash
# The GPU check: the project's CUDA paths proven on a GPU machine in one command, in at most 8 minutes, each step
# time-boxed and recorded in one JSON file (docs/gpu-check.md is the manual). From the repository root, with the
# machine's own python3 (no venv, no network):
#
#   bash scripts/gpu_check.sh                        # on a GPU machine: CUDA, NCCL, every GPU
#   GPU_CHECK_DEVICE=cpu bash scripts/gpu_check.sh   # the rehearsal: every step on CPU with Gloo
#   bash scripts/gpu_check.sh --prepare              # where PyPI answers: what the Horovod build needs offline,
#                                                    # into runs/gpu-carry (carried with the working tree)
#
# Steps: install (pip install --no-deps --no-build-isolation -e ., else PYTHONPATH), ddp (torchrun, NCCL, resnet18),
# amp_fp16, amp_bf16, channels_last, exact (twice, and at world size 1 with 2+ GPUs), horovod_api
# (examples/gpu/train_horovod.py under torchrun -m ddp_train.horovod_api), horovod_build (Horovod with NCCL and
# the Gloo controller, beside the steps after ddp, at most 4 minutes), compare (compare-backends at the GPU count).
# Exit code 0 when every step that should work did, 1 otherwise (the JSON says which and its error line).
#
# Variables:
#   GPU_CHECK_DEVICE   cuda (default) or cpu
#   GPU_CHECK_OUT      where gpu_check.json and gpu_check_logs.tar.gz go (default benchmarks/results/gpu/; the
#                      rehearsal's: runs/gpu-check/cpu/)
#   GPU_CHECK_WORK     run directories and logs (default runs/gpu-check/DEVICE/, emptied first)
#   GPU_CHECK_PYTHON   the interpreter (default python3)
#   GPU_CHECK_NPROC    processes per run (default: every GPU; 2 in the rehearsal)
#   GPU_CHECK_BUDGET   seconds for the whole check (default 480; 300 in the rehearsal)
#   GPU_CHECK_STEPS    comma-separated steps to run (default all; the others are recorded as skipped)
#   GPU_CHECK_FAIL     comma-separated steps forced to fail: their command gets an option every program refuses
#                      (install: pip's fails, and the PYTHONPATH fallback is taken)
#   GPU_CHECK_HOROVOD_BUILD  auto (default: build on a GPU machine, not in the rehearsal), 1, 0
#   GPU_CHECK_CARRY    the folder with Horovod's source for the offline build (default runs/gpu-carry)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${GPU_CHECK_PYTHON:-python3}"
command -v "$PY" >/dev/null || { echo "gpu_check: error: no $PY on PATH; set GPU_CHECK_PYTHON" >&2; exit 2; }
exec "$PY" scripts/gpu_check "$@"
