"""`python scripts/gpu_check [--prepare]` (what scripts/gpu_check.sh runs): the check's command line."""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a folder, python puts this folder first on sys.path; its parent, scripts/, lets the package import
    # itself as `gpu_check`, with nothing else of the tree on the path.
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    from gpu_check.cli import main

    sys.exit(main())
