"""`python scripts/gpu_check [--prepare]` (what scripts/gpu_check.sh runs): the check's command line."""

import sys
from pathlib import Path


def main() -> int:
    """The check's exit code."""
    # Run as a folder, python puts this folder first on sys.path; its parent, scripts/, lets the package import
    # itself as `gpu_check`, as `python scripts/gpu_check.py` had scripts/ there and nothing else of the tree.
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    from gpu_check.cli import main as check

    return check()


if __name__ == "__main__":
    sys.exit(main())
