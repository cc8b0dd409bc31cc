"""The rules of horovod.spark.run and RayExecutor on the API, without starting Spark or Ray: every rank's outcome to
the list in rank order or one error, the driver's socket for the ranks' reports, ranks on hosts, local masters."""

from __future__ import annotations

import socket

import pytest

from ddp_train.horovod_api.collector import Address, Collector, report
from ddp_train.horovod_api.outcomes import Outcome, RemoteError, WorkerError, first_error, in_rank_order
from ddp_train.horovod_api.ray_executor import Place, RayExecutor, local_ranks, rank_env
from ddp_train.horovod_api.spark import ELASTIC_REFUSED, is_local_master, run_elastic


def test_values_come_back_in_rank_order_whatever_order_they_arrived_in():
    outcomes = {2: Outcome(2, "c"), 0: Outcome(0, "a"), 1: Outcome(1, "b")}
    assert in_rank_order("here", outcomes, 3) == ["a", "b", "c"]


def test_a_rank_that_raised_is_named_with_its_message_and_traceback():
    try:
        raise ValueError("no data")
    except ValueError as exc:
        error = RemoteError.of(1, exc)
    with pytest.raises(WorkerError) as caught:
        in_rank_order("horovod.spark.run", {0: Outcome(0, "a"), 1: Outcome(1, error=error)}, 2)
    assert str(caught.value) == "horovod.spark.run: rank 1 raised ValueError: no data"
    assert caught.value.rank == 1 and caught.value.kind == "ValueError"
    assert "raise ValueError" in caught.value.__notes__[0]


def test_the_rank_that_failed_of_itself_is_named_before_one_a_lost_peer_failed():
    lost = RemoteError(0, "HorovodInternalError", "peer gone")
    own = RemoteError(1, "KeyError", "'x'")
    assert first_error([Outcome(0, error=lost), Outcome(1, error=own)]) == own
    assert first_error([Outcome(0, error=lost)]) == lost
    assert first_error([Outcome(0, 1)]) is None


def test_ranks_that_never_reported_are_named():
    with pytest.raises(RuntimeError, match=r"^here: ranks 1, 2 of 3 ended without returning"):
        in_rank_order("here", {0: Outcome(0, "a")}, 3)


def test_the_collector_keeps_reports_with_the_token_only():
    with Collector("127.0.0.1") as collector:
        report(collector.address, Outcome(1, {"weights": "abc"}))
        stranger = Address(collector.address.host, collector.address.port, b"x" * len(collector.token))
        with pytest.raises(ConnectionError):
            report(stranger, Outcome(0, "forged"))
        report(collector.address, Outcome(0, [1, 2]))
        assert collector.by_rank() == {1: Outcome(1, {"weights": "abc"}), 0: Outcome(0, [1, 2])}


def test_the_first_error_reported_calls_on_error_once():
    calls = []
    with Collector("127.0.0.1", on_error=lambda: calls.append("cancel")) as collector:
        report(collector.address, Outcome(0, "fine"))
        assert calls == []
        report(collector.address, Outcome(1, error=RemoteError(1, "ValueError", "no data")))
        report(collector.address, Outcome(0, error=RemoteError(0, "HorovodInternalError", "peer gone")))
    assert calls == ["cancel"]


def test_a_value_that_cannot_be_pickled_reaches_the_driver_as_its_error():
    with Collector("127.0.0.1") as collector, socket.socket() as unpicklable:
        report(collector.address, Outcome(0, unpicklable))
        error = collector.by_rank()[0].error
    assert error is not None and error.message.startswith("its return value cannot be pickled")


def test_local_ranks_and_the_rendezvous_of_ray_workers_on_two_nodes():
    places = [Place("10.0.0.1", "a"), Place("10.0.0.2", "b"), Place("10.0.0.1", "a")]
    assert local_ranks(places) == [(0, 2), (0, 1), (1, 2)]
    env = rank_env(places, 29500)
    assert [e["RANK"] for e in env] == ["0", "1", "2"]
    assert {e["MASTER_ADDR"] for e in env} == {"10.0.0.1"} and {e["MASTER_PORT"] for e in env} == {"29500"}
    assert [e["GROUP_RANK"] for e in env] == ["0", "1", "0"]


def test_ray_executor_refuses_elastic_and_ambiguous_sizes_in_one_line():
    with pytest.raises(ValueError, match="elastic Horovod on Ray"):
        RayExecutor(num_workers=2, min_workers=1, max_workers=4)
    with pytest.raises(ValueError, match="pass num_workers=N, or num_hosts=H"):
        RayExecutor(num_workers=2, num_hosts=2)
    settings = RayExecutor.create_settings(timeout_s=5, placement_group_timeout_s=7)
    assert (settings.timeout_s, settings.placement_group_timeout_s) == (5, 7)


def test_local_masters_and_run_elastic():
    assert is_local_master("local") and is_local_master("local[2]") and is_local_master("local[*]")
    assert not is_local_master("spark://node0:7077") and not is_local_master("local-cluster[2,1,1024]")
    with pytest.raises(ValueError) as caught:
        run_elastic(print, num_proc=2)
    assert str(caught.value) == ELASTIC_REFUSED and "\n" not in ELASTIC_REFUSED
