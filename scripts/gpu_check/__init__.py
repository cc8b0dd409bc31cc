"""The GPU check run by scripts/gpu_check.sh (docs/gpu-check.md), standard library only."""
