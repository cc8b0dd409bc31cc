"""The GPU check run by scripts/gpu_check.sh (docs/gpu-check.md), standard library only: spec.py (the steps as a
table; install.py, training.py and horovod.py what they run), runner.py (their order, time boxes and lines),
context.py (what they share: records, commands), settings.py (GPU_CHECK_*), cli.py (the command line, the JSON)."""
