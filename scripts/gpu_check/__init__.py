"""The GPU check run by scripts/gpu_check.sh (docs/gpu-check.md), standard library only: runner.py (the steps' table
and its runner), install.py, training.py and horovod.py (what they run), context.py (what they share), cli.py."""
