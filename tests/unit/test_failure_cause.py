"""A failed run's line names the first failing rank's own exception, not the launcher's wrapper
(common.compare.failures), read from launch.log texts of the shape each launcher prints: copied, shortened, from a
2-rank script that failed under the probe through torchrun, horovodrun --gloo, horovodrun --mpi and mpirun."""

from __future__ import annotations

from common.compare.failures import cause, failed_with, first_failed, raised

NOT_INITIALIZED = "ValueError: Horovod has not been initialized; use hvd.init()."

#: torchrun, once the process group is up: each rank's traceback prefixed [rankN]:, rank 0's a consequence of rank
#: 1's failure; then torchrun's own ChildFailedError, whose Root Cause names rank 1
TORCHRUN = """\
W1207 00:26:28.435000 7937 torch/distributed/run.py:982] *****************************************
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/main/common/launch/userscript.py", line 123, in run
[rank1]:     runpy.run_path(code.target, run_name="__main__")
[rank1]:   File "fail_ddp.py", line 5, in <module>
[rank1]:     raise ValueError("bad batch size 0 on rank 1; give --batch-size >= 1")
[rank1]: ValueError: bad batch size 0 on rank 1; give --batch-size >= 1
[rank0]: Traceback (most recent call last):
[rank0]:   File "fail_ddp.py", line 6, in <module>
[rank0]:     dist.barrier()
[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:2756.
W1207 00:26:38.395000 7937 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 7977 closing
E1207 00:26:38.651000 7937 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1
Traceback (most recent call last):
  File "/work/main/.venv/bin/torchrun", line 10, in <module>
    sys.exit(main())
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 386, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
common.probe FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7977)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_00:26:38
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 7978)
============================================================
"""

#: torchrun before any process group: the rank's traceback comes bare (the Horovod API's hvd.size() before init)
TORCHRUN_BARE = """\
starting
Traceback (most recent call last):
  File "fail_hvd.py", line 4, in <module>
    print(hvd.size())
  File "/work/main/ddp_train/horovod_api/runtime.py", line 294, in active
    raise ValueError(NOT_INITIALIZED)
ValueError: Horovod has not been initialized; use hvd.init().
W1207 00:26:49.156000 8077 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 8093 closing
Traceback (most recent call last):
  File "/work/main/.venv/bin/torchrun", line 10, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
"""

#: horovodrun --gloo: [N]<stderr>: per rank, then its own RuntimeError
HOROVODRUN_GLOO = """\
[0]<stdout>:starting
[0]<stderr>:Traceback (most recent call last):
[0]<stderr>:  File "fail_hvd.py", line 4, in <module>
[0]<stderr>:    print(hvd.size())
[0]<stderr>:  File "/work/main/.venv/lib/python3.11/site-packages/horovod/common/basics.py", line 194, in size
[0]<stderr>:    raise ValueError(
[0]<stderr>:ValueError: Horovod has not been initialized; use hvd.init().
[1]<stderr>:Traceback (most recent call last):
[1]<stderr>:  File "fail_hvd.py", line 4, in <module>
[1]<stderr>:KeyError: 'only rank 1 says this'
Process 0 exit with status code 1.
Terminating remaining workers after failure of Process 0.
[1]<stderr>:Terminated
Process 1 exit with status code 143.
Traceback (most recent call last):
  File "/work/main/.venv/bin/horovodrun", line 10, in <module>
    sys.exit(run_commandline())
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/gloo_run.py", line 284, in launch_gloo
    raise RuntimeError('Horovod detected that one or more processes exited with non-zero '
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be \
terminated. The first process to do so was:
Process name: 0
Exit code: 1
"""

#: horovodrun --mpi: Open MPI's tagged output [J,N]<stderr>: (its code lines interleaved with tags), then mpirun's box
#: naming rank 1 first
HOROVODRUN_MPI = """\
[1,0]<stderr>:Traceback (most recent call last):
[1,0]<stderr>:  File "/work/main/common/probe/__main__.py", line 107, in <module>
[1,0]<stderr>:    [1,0]<stderr>:main()[1,0]<stderr>:
[1,0]<stderr>: [1,0]<stderr>: [1,0]<stderr>:        ^^^^^^^^^^
[1,0]<stderr>:RuntimeError: rank 0 lost its peer
[1,1]<stderr>:Traceback (most recent call last):
[1,1]<stderr>:  File "fail_hvd.py", line 4, in <module>
[1,1]<stderr>:    print(hvd.size())
[1,1]<stderr>:ValueError: Horovod has not been initialized; use hvd.init().
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[29457,1],1]
  Exit code:    1
--------------------------------------------------------------------------
"""

#: plain mpirun: the ranks' tracebacks untagged, a chained exception, then mpirun's box
MPIRUN_CHAINED = """\
Traceback (most recent call last):
  File "train.py", line 9, in load
    return torch.load(path)
FileNotFoundError: [Errno 2] No such file or directory: 'ck.pt'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "train.py", line 12, in <module>
    load("ck.pt")
RuntimeError: no checkpoint to resume from; give --checkpoint
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[19697,1],1]
  Exit code:    1
--------------------------------------------------------------------------
"""


def lines(text: str) -> list:
    return text.splitlines()


def test_torchrun_names_the_root_cause_rank_and_its_exception_not_childfailederror():
    assert first_failed(lines(TORCHRUN)) == 1
    assert cause(lines(TORCHRUN)) == "rank 1: ValueError: bad batch size 0 on rank 1; give --batch-size >= 1"


def test_a_bare_traceback_under_torchrun_is_named_without_a_rank():
    assert cause(lines(TORCHRUN_BARE)) == NOT_INITIALIZED


def test_horovodrun_gloo_names_the_rank_it_terminated_the_others_for():
    assert first_failed(lines(HOROVODRUN_GLOO)) == 0
    assert cause(lines(HOROVODRUN_GLOO)) == f"rank 0: {NOT_INITIALIZED}"
    found = raised(lines(HOROVODRUN_GLOO))
    assert [r.launcher for r in found] == [False, False, True]  # horovodrun's own RuntimeError is its wrapper


def test_open_mpi_names_the_first_failed_rank_in_its_box():
    assert first_failed(lines(HOROVODRUN_MPI)) == 1
    assert cause(lines(HOROVODRUN_MPI)) == f"rank 1: {NOT_INITIALIZED}"


def test_a_chained_exception_is_named_by_its_last_exception():
    assert cause(lines(MPIRUN_CHAINED)) == "RuntimeError: no checkpoint to resume from; give --checkpoint"


def test_a_run_across_hosts_has_its_host_prefixes_read_past():
    across = "\n".join(f"[node1] {line}" for line in lines(TORCHRUN))
    assert cause(lines(across)) == "rank 1: ValueError: bad batch size 0 on rank 1; give --batch-size >= 1"


def test_the_projects_one_line_error_comes_before_any_traceback():
    told = TORCHRUN + "[rank 0] ddp_train: error: ranks 1 (node1) stopped taking part (cannot be reached)\n"
    assert cause(lines(told)) == "[rank 0] ddp_train: error: ranks 1 (node1) stopped taking part (cannot be reached)"
    pointing = TORCHRUN + "[rank 1] ddp_train: error: rank 1 failed (traceback above); the launcher stops the others\n"
    assert cause(lines(pointing)).startswith("rank 1: ValueError")


def test_without_a_traceback_the_last_error_line_or_the_last_line():
    assert cause(["mpirun: error: MPI is broken on this host"]) == "mpirun: error: MPI is broken on this host"
    assert cause(["something", "the end"]) == "the end"
    assert cause([]) == "no output"


def test_a_run_that_started_with_another_runs_file_is_named_by_that_first():
    clash = "ddp@2#1 started with /tmp/ck.pt, which horovod-gloo@2#1 wrote before it"
    refused = "[rank 0] probe: error: train.py: made no optimizer step the probe could follow"
    assert failed_with(refused, clash) == clash  # not the probe's misleading refusal
    assert failed_with("rank 1: KeyError: 'fc.weight'", clash) == f"{clash}; then rank 1: KeyError: 'fc.weight'"
    assert failed_with(refused, None) == refused
