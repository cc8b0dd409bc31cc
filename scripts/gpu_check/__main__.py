"""`python scripts/gpu_check [--prepare]`, what scripts/gpu_check.sh runs."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # scripts/: the package imports itself as gpu_check
    from gpu_check.cli import main

    sys.exit(main())
