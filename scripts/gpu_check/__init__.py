"""The GPU check's steps, run by scripts/gpu_check.sh (docs/gpu-check.md is the manual).

Python's standard library only: it starts before the project is installed, with the machine's own python3. Each
step runs its commands in a process group of their own under a time box, and is recorded in one JSON file with
its outcome (ok, failed, timeout, skipped), its time, what it measured and, where it failed, the error line.

- spec.py: the steps, one specification each (time box, reserve, order, background or not), in one list
- settings.py: the GPU_CHECK_* variables; runner.py: the order, the time boxes, the background step
- steps/: the steps themselves; report.py: the printed lines, gpu_check.json and the logs' archive
- commands.py, output.py, clock.py, record.py, context.py: what those share; cli.py, prepare.py: the command line
"""
