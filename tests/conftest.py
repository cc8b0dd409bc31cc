import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

from cluster import cluster  # noqa: E402,F401  (the simulated two-host cluster, one per session)
from launch import Runs  # noqa: E402

# A suite started in the background (`make test &`, nohup in a script) inherits SIGINT ignored, and so would
# every job it starts; the tests send SIGINT as a terminal's Ctrl-C does, so jobs start with the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Training runs shared by all tests of the session: runs(launcher, np, args) -> Launched."""
    return Runs(tmp_path_factory.mktemp("shared-runs"))
