#!/usr/bin/env bash
# The main job: train the embedded default (convnet on digits) with DDP and Horovod through
# the real launchers at world sizes 1, 2 and 3, and write the comparison report.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-runs/demo}"
cd "$ROOT"
status=0
"$ROOT/.venv/bin/python" -m common.compare --out "$OUT" || status=$?
echo
echo "Report: $(cd "$OUT" && pwd)/report.md  (plots and summary.json beside it)"
exit "$status"
