"""Speed verdicts with their conditions (common.compare.analysis): runs with more busy threads than cores measure the
machine's contention and are never called a difference between backends (no process launched)."""

from __future__ import annotations

from common.compare import analysis
from common.compare.matrix import ranks_per_host
from .made_up import made_run


def timed(backend: str, samples_per_s: float, ranks: int, threads: int, cores: int, controller=None, repeat=0):
    return made_run(backend, ranks, controller=controller, repeat=repeat, summary={"samples_per_s": samples_per_s},
                    config={"threads": threads, "cores": cores, "ranks_per_host": ranks})


def verdicts(runs):
    return analysis.speed_verdicts(runs, analysis.throughput_table(runs))


def test_runs_that_share_cores_are_said_to_measure_contention():
    runs = [timed("ddp", 5000, 3, 1, 2), timed("horovod", 1000, 3, 1, 2, controller="mpi")]
    (v,) = verdicts(runs)
    assert v["contended"] and v["significant"] is None
    assert "3 ranks x 1 thread on 2 cores: the ranks compete for cores" in v["verdict"]
    assert "not a difference between the backends" in v["verdict"]


def test_runs_within_the_cores_name_them_and_judge_the_spread():
    runs = [timed("ddp", 5000, 2, 1, 2), timed("ddp", 5100, 2, 1, 2, repeat=1),
            timed("horovod", 4000, 2, 1, 2, controller="gloo"), timed("horovod", 4100, 2, 1, 2, controller="gloo",
                                                                      repeat=1)]
    (v,) = verdicts(runs)
    assert not v["contended"] and v["significant"] is True
    assert v["verdict"].startswith("ddp is 24.7% faster than horovod-gloo at world size 2 on one host, 2 ranks x 1 "
                                   "thread on 2 cores")


def test_the_ranks_a_run_places_on_its_busiest_host():
    assert ranks_per_host(None, 3) == 3
    assert ranks_per_host("node0:4,node1:2", 6) == 4
