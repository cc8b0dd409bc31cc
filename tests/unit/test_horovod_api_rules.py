"""The Horovod API's rules that need no launch: Horovod's cross-rank checks and their messages, its arithmetic (how
a buffer is scaled, what Average divides by, how reducescatter and alltoall split), ranks from host names, the
framing of the coordinator's messages, the stall report, the settings read from Horovod's variables."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ddp_train.horovod_api import arithmetic, checks, messages, negotiation, optimizer, settings
from ddp_train.horovod_api.dtypes import AVERAGE, MIN, SUM
from ddp_train.horovod_api.messages import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCESCATTER, Request
from ddp_train.horovod_api.runtime import Topology


def request(rank: int, kind: str = ALLREDUCE, dtype: str = "HOROVOD_FLOAT32", shape=(17, 17), **fields) -> Request:
    return Request(rank, 0, 0, "allreduce.x", kind, dtype=dtype, shape=list(shape), **fields)


def test_matching_requests_pass():
    assert checks.mismatch([request(0), request(1), request(2)]) is None


def test_mismatched_shapes_are_horovods_message():
    message = checks.mismatch([request(0, shape=(17, 17)), request(1, shape=(18, 17))])
    assert message == ("Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [17, 17], but another "
                       "rank sent a tensor of shape [18, 17].")


@pytest.mark.parametrize("field, first, second, expected", [
    ("dtype", "HOROVOD_FLOAT32", "HOROVOD_INT32",
     "Mismatched data types: One rank had type HOROVOD_FLOAT32, but another rank had type HOROVOD_INT32."),
    ("op", AVERAGE, SUM, "Mismatched reduction operation: One rank sent reduction op 0, but another rank sent "
                         "reduction op 1."),
    ("postscale", 1.0, 0.5, "Mismatched prescale and/or postscale factors: One rank sent factors (1, 1), but "
                            "another rank sent factors (1, 0.5)."),
    ("device", -1, 0, "Mismatched ALLREDUCE CPU/GPU device selection: One rank specified device CPU, but another "
                      "rank specified device GPU."),
])
def test_each_mismatch_is_named(field, first, second, expected):
    assert checks.mismatch([request(0, **{field: first}), request(1, **{field: second})]) == expected


def test_gathers_may_differ_in_the_first_dimension_only():
    assert checks.mismatch([request(0, ALLGATHER, shape=(3, 5)), request(1, ALLGATHER, shape=(7, 5))]) is None
    assert checks.mismatch([request(0, ALLGATHER, shape=(3, 5)), request(1, ALLGATHER, shape=(3, 6))]) == (
        "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 equal to 5, but another rank "
        "sent a tensor with dimension 1 equal to 6.")
    assert checks.mismatch([request(0, ALLTOALL, shape=(4,)), request(1, ALLTOALL, shape=(4, 2))]) == (
        "Mismatched ALLTOALL tensor shapes: One rank sent a tensor of rank 1, but another rank sent a tensor of "
        "rank 2.")
    assert checks.mismatch([request(0, ALLGATHER, shape=()), request(1, ALLGATHER, shape=())]) == (
        "Process-set rank zero tried to ALLGATHER a rank-zero tensor.")


def test_broadcast_roots_must_agree():
    assert checks.mismatch([request(0, BROADCAST, root=0), request(1, BROADCAST, root=1)]) == (
        "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank specified root rank 1.")


def test_what_cannot_run_beside_joined_ranks():
    assert checks.mismatch([request(0, ALLGATHER), request(1, ALLGATHER)], joined=1).startswith(
        "Allgather is not supported with Join at this time.")
    assert checks.mismatch([request(0, BROADCAST)], joined=1) == "Broadcast is not supported with Join at this time."
    assert checks.mismatch([request(0), request(1)], joined=1) is None  # allreduce: the joined add zeros


def test_reducescatter_prescale_needs_the_fusion_buffer():
    big = [request(0, REDUCESCATTER, shape=(1024,), prescale=0.5)]
    assert "increase HOROVOD_FUSION_THRESHOLD" in checks.mismatch(big, fusion_threshold=1024)
    assert checks.mismatch(big, fusion_threshold=4096) is None


def test_float32_scaling_multiplies_by_the_factor_in_float32():
    values = np.float32(np.random.default_rng(0).uniform(-100, 100, 1000))
    buffer = torch.from_numpy(values.copy())
    arithmetic.scale_(buffer, 1 / 3)
    assert np.array_equal(buffer.numpy(), values * np.float32(1 / 3))  # Horovod's (float)factor * x
    assert not np.array_equal(buffer.numpy(), values / np.float32(3))  # not a division


def test_float16_scaling_rounds_the_float32_product():
    values = np.float16(np.random.default_rng(1).uniform(-10, 10, 1000))
    buffer = torch.from_numpy(values.copy())
    arithmetic.scale_(buffer, 0.3)
    assert np.array_equal(buffer.numpy(), np.float16(np.float32(values) * np.float32(0.3)))


def test_integer_scaling_truncates_the_float64_product():
    buffer = torch.tensor([7, -7, 10, -10, 2 ** 40 + 1], dtype=torch.int64)
    arithmetic.scale_(buffer, 1 / 3)
    assert buffer.tolist() == [int(v * (1 / 3)) for v in (7, -7, 10, -10, 2 ** 40 + 1)]  # toward zero: 2, -2, 3, -3


def test_average_folds_one_over_size_into_the_postscale():
    assert arithmetic.postscale(AVERAGE, 2.0, 3) == 2.0 / 3
    assert arithmetic.postscale(SUM, 2.0, 3) == 2.0
    assert arithmetic.postscale(MIN, 1.0, 3) == 1.0


def test_reducescatter_gives_the_first_ranks_the_extra_rows():
    assert arithmetic.reducescatter_rows(12, 3) == [4, 4, 4]
    assert arithmetic.reducescatter_rows(13, 3) == [5, 4, 4]
    assert arithmetic.reducescatter_rows(2, 3) == [1, 1, 0]


def test_alltoall_splits():
    assert arithmetic.alltoall_splits(6, [], 3) == [2, 2, 2]
    assert arithmetic.alltoall_splits(6, [1, 0, 4], 3) == [1, 0, 4]
    with pytest.raises(ValueError, match="not an even multiple of the number of workers"):
        arithmetic.alltoall_splits(7, [], 3)
    with pytest.raises(ValueError, match="greater than the first dimension"):
        arithmetic.alltoall_splits(2, [1, 1, 1], 3)
    with pytest.raises(ValueError, match="does not equal number of workers"):
        arithmetic.alltoall_splits(6, [3, 3], 3)


def test_local_and_cross_ranks_from_host_names():
    hosts = ["a", "a", "b", "b"]
    assert [Topology.from_hosts(hosts, r).local_rank for r in range(4)] == [0, 1, 0, 1]
    assert [Topology.from_hosts(hosts, r).cross_rank for r in range(4)] == [0, 0, 1, 1]
    assert Topology.from_hosts(hosts, 3).cross_size == 2 and Topology.from_hosts(hosts, 3).homogeneous
    uneven = Topology.from_hosts(["a", "a", "b"], 1)
    assert (uneven.local_rank, uneven.local_size, uneven.cross_size, uneven.homogeneous) == (1, 2, 1, False)


def test_messages_survive_the_wire_in_pieces():
    sent = messages.requests_message([request(0, shape=(2, 3), prescale=1 / 3), request(1, ALLGATHER)])
    frame = messages.encode(sent) + messages.encode({"type": "alive"})
    reader = messages.FrameReader()
    received = reader.feed(frame[:7]) + reader.feed(frame[7:])
    assert [m["type"] for m in received] == ["requests", "alive"]
    assert messages.read_requests(received[0]) == messages.read_requests(sent)
    assert messages.read_requests(received[0])[0].prescale == 1 / 3  # every bit of a double


def test_stall_report_names_the_missing_ranks():
    report = negotiation.stall_report({1: ["allreduce.b", "allreduce.a"]}, {1}, 60, 300)
    assert "waiting for remainder of ranks for more than 60 seconds" in report
    assert "\n1!: [allreduce.a, allreduce.b]" in report
    assert report.endswith('One or more rank (marked by "!") is stalled for longer than 300 seconds. Will shutdown.')


def test_grouped_tensors_keep_their_order():
    assert sorted(["g_10of12", "g_2of12", "g_1of12"], key=negotiation.group_index) == ["g_1of12", "g_2of12",
                                                                                       "g_10of12"]


def test_groups_of_parameters_split_as_horovod_splits_them():
    assert optimizer.split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]


def test_settings_from_horovods_variables(monkeypatch):
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "0")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "10")
    read = settings.Settings.from_environment()
    assert (read.fusion_threshold, read.cycle_time_s, read.stall_shutdown_s) == (0, 0.005, 10.0)
    assert read.stall_check_s == 10.0  # reported when the wait ends, not after it
    monkeypatch.delenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    monkeypatch.delenv("HOROVOD_FUSION_THRESHOLD")
    assert settings.Settings.from_environment().stall_shutdown_s == settings.STALL_SHUTDOWN_S
    assert settings.Settings.from_environment().fusion_threshold == 128 * 2 ** 20
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "fast")
    with pytest.raises(ValueError, match="HOROVOD_CYCLE_TIME='fast' is not a number"):
        settings.Settings.from_environment()


def test_the_timeline_marks_the_engines_cycles_only_when_cycles_are_marked(tmp_path):
    from ddp_train.horovod_api import timeline

    for mark_cycles in (False, True):
        path = tmp_path / f"t{mark_cycles}.json"
        timeline.start(str(path), mark_cycles)
        timeline.record("allreduce.a,allreduce.b", "CYCLE_GUESSED", True)
        timeline.record("", "CYCLE_AGREED", True)
        timeline.stop()
        marks = [e for e in json.loads(path.read_text()) if e.get("ph") == "i"]
        if not mark_cycles:
            assert marks == []
            continue
        assert [(e["name"], e.get("args")) for e in marks] == [
            ("CYCLE_GUESSED", {"collectives": "allreduce.a,allreduce.b"}), ("CYCLE_AGREED", None)]


def test_each_kind_of_call_adds_its_own_fields_to_its_requests():
    from ddp_train.horovod_api import calls
    from ddp_train.horovod_api.process_sets import global_process_set

    one = ([torch.ones(2)], [None], None, global_process_set)
    assert calls.Allreduce(*one, op=AVERAGE, prescale=2, checked=True).fields() == {
        "op": AVERAGE, "prescale": 2.0, "postscale": 1.0, "checked": True}
    assert calls.Allgather(*one).fields() == {} and calls.Allgather(*one).prefix == "allgather"
    assert calls.Broadcast(*one, root=2).fields() == {"root": 2}
    alltoall = calls.Alltoall(*one, splits=(1, 1), received_on=torch.device("cpu"))
    assert alltoall.fields() == {"splits": [1, 1]} and alltoall.splits_device() == torch.device("cpu")
    assert calls.Reducescatter(*one, op=SUM).kind == REDUCESCATTER
    assert calls.Allreduce(*one).splits_device() is None
