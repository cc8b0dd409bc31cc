import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import cluster  # noqa: E402,F401  (the simulated two-host cluster, one per session)
