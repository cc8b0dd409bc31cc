"""The launch layer: which launchers exist (declared by the backends), starting and stopping jobs
through them, and telling, inside a process, which launcher and rank it runs under. It imports nothing of the
project outside `common.launch` (the backends' launchers are found through entry points), so every other part
may use it:

- registry: `Launcher`, `get(name)`, `launchers()`, `host_launchers()`, `find(backend, controller)`;
- jobs: `Job` (own process group, captured output, time limit, teardown), `run`, `job_env`;
  `terminating_like_ctrl_c`, `stopped_exit`: a driver stops its running job on SIGTERM as on Ctrl-C;
- placement: `detect()` -> `Placement` (launcher, rank, world size, local rank and size), `rank_hint`,
  `default_threads`;
- startup: `pause_collector`, `resume_collector`: a process's start-up without the garbage collector's scans.
"""

from .jobs import (Job, JobTimeout, Result, job_env, run, runs_module, still_running,
                   stopped_exit, terminating_like_ctrl_c)
from .placement import Placement, cores, default_threads, detect, rank_hint
from .registry import Launcher, find, get, host_launchers, launchers

__all__ = ["Job", "JobTimeout", "Result", "job_env", "run", "runs_module",
           "still_running", "stopped_exit", "terminating_like_ctrl_c", "Placement", "cores",
           "default_threads", "detect", "rank_hint", "Launcher", "find", "get", "host_launchers", "launchers"]
