"""The step-time forecast for another link (common.compare.forecast): the ring's bytes and rounds, backward's window,
never less exposed than measured, and what a run's summary must record for it."""

from __future__ import annotations

import pytest

from common.compare.forecast import (DDP_BUCKET, HOROVOD_FUSION, REPORT_LINKS, Link, Measured, collectives,
                                     forecasts_ms, step_s, wire_s)

MB = 2 ** 20


def test_collectives_are_ddps_buckets_or_horovods_fusion_buffers():
    assert collectives(0, "ddp") == 0
    assert collectives(MB, "ddp") == 1 and collectives(MB + 1, "ddp") == 2
    assert collectives(MB + 2 * DDP_BUCKET, "ddp") == 3
    assert collectives(HOROVOD_FUSION, "horovod") == 1 and collectives(HOROVOD_FUSION + 1, "horovod") == 2


def test_the_ring_sends_2_n_minus_1_over_n_of_the_bytes_and_waits_its_rounds():
    resnet18 = Measured(world_size=2, reduced_bytes=46_800_000, data_s=0.0, compute_s=1.0, exposed_s=0.0)
    assert wire_s(resnet18, Link(1e9)) == pytest.approx(0.3744)
    four = Measured(world_size=4, reduced_bytes=10_000_000, data_s=0.0, compute_s=1.0, exposed_s=0.0)
    # 1.5 x the bytes at 4 ranks; DDP's first bucket and one more of 25 MiB, 6 rounds each at 1 ms
    assert wire_s(four, Link(1e9, latency_s=1e-3)) == pytest.approx(0.12 + 2 * 6 * 1e-3)
    assert wire_s(Measured(1, 10_000_000, 0.0, 1.0, 0.0), Link(1e9)) == 0.0


def test_backward_hides_up_to_two_thirds_of_the_compute_and_the_rest_is_exposed():
    hidden = Measured(world_size=2, reduced_bytes=46_800_000, data_s=0.01, compute_s=1.2, exposed_s=0.02)
    assert step_s(hidden, Link(1e9)) == pytest.approx(0.01 + 1.2 + 0.02)  # 0.37 s of wire inside 0.8 s of backward
    bare = Measured(world_size=2, reduced_bytes=46_800_000, data_s=0.0, compute_s=0.3, exposed_s=0.01)
    assert step_s(bare, Link(1e9)) == pytest.approx(0.3 + 0.3744 - 0.2)
    assert step_s(bare, Link(1e8)) == pytest.approx(0.3 + 3.744 - 0.2)


def test_a_run_without_its_time_split_or_reduced_bytes_has_no_forecast():
    summary = {"world_size": 2, "backend": "ddp", "reduced_bytes_per_step": 4_000_000,
               "time_split": {"data_ms": 1.0, "compute_ms": 3.0, "comm_ms": 2.0, "step_ms": 6.0}}
    found = forecasts_ms(summary)
    assert list(found) == [link.describe() for link in REPORT_LINKS] == ["10 Gbit/s", "1 Gbit/s"]
    assert found["1 Gbit/s"] == pytest.approx(1.0 + 3.0 + max(2.0, 32.0 - 2.0))
    assert found["10 Gbit/s"] == pytest.approx(1.0 + 3.0 + max(2.0, 3.2 - 2.0))
    assert forecasts_ms({**summary, "reduced_bytes_per_step": None}) == {"10 Gbit/s": None, "1 Gbit/s": None}
    assert Measured.of({"time_split": {}, "reduced_bytes_per_step": 1}) is None
    assert Link(1e9, 5e-5).describe() == "1 Gbit/s, 50 µs" and Link(5e8).describe() == "500 Mbit/s"
