"""The step-time forecast for another link (common.compare.forecast): the ring's bytes and rounds, backward's window,
DDP's last bucket, never less exposed than measured, and what a run's summary must record for it."""

from __future__ import annotations

import pytest

from common.compare.forecast import (DDP_BUCKET, HOROVOD_FUSION, REPORT_LINKS, Link, Measured, collectives,
                                     ddp_buckets, exposed_s, forecasts_ms, step_s, wire_s)

MB = 2 ** 20


def test_collectives_are_ddps_buckets_or_horovods_fusion_buffers():
    assert collectives(0, "ddp") == 0
    assert collectives(MB, "ddp") == 1 and collectives(MB + 1, "ddp") == 2
    assert collectives(MB + 2 * DDP_BUCKET, "ddp") == 3
    assert collectives(HOROVOD_FUSION, "horovod") == 1 and collectives(HOROVOD_FUSION + 1, "horovod") == 2
    # a script on the Horovod API forms DDP's buckets; on Horovod itself, its fusion buffers
    assert collectives(MB + 1, "horovod-api") == 2 and collectives(MB + 1, "horovod") == 1
    assert ddp_buckets(0) == [] and ddp_buckets(1000) == [1000]
    assert ddp_buckets(MB + 2 * DDP_BUCKET + 5) == [MB, DDP_BUCKET, DDP_BUCKET, 5]


def test_the_ring_sends_2_n_minus_1_over_n_of_the_bytes_and_waits_its_rounds():
    resnet18 = Measured(world_size=2, reduced_bytes=46_800_000, data_s=0.0, compute_s=1.0, exposed_s=0.0)
    assert wire_s(resnet18, Link(1e9)) == pytest.approx(0.3744)
    four = Measured(world_size=4, reduced_bytes=10_000_000, data_s=0.0, compute_s=1.0, exposed_s=0.0)
    # 1.5 x the bytes at 4 ranks; DDP's first bucket and one more of 25 MiB, 6 rounds each at 1 ms
    assert wire_s(four, Link(1e9, latency_s=1e-3)) == pytest.approx(0.12 + 2 * 6 * 1e-3)
    assert wire_s(Measured(1, 10_000_000, 0.0, 1.0, 0.0), Link(1e9)) == 0.0


def test_horovod_keeps_the_link_busy_through_backward_and_leaves_what_exceeds_it_exposed():
    hidden = Measured(2, 46_800_000, data_s=0.01, compute_s=1.2, exposed_s=0.02, backend="horovod")
    assert step_s(hidden, Link(1e9)) == pytest.approx(0.01 + 1.2 + 0.02)  # 0.37 s of wire inside 0.8 s of backward
    bare = Measured(2, 46_800_000, data_s=0.0, compute_s=0.3, exposed_s=0.01, backend="horovod")
    assert step_s(bare, Link(1e9)) == pytest.approx(0.3 + 0.3744 - 0.2)
    assert step_s(bare, Link(1e8)) == pytest.approx(0.3 + 3.744 - 0.2)


def test_ddps_last_bucket_starts_when_backward_ends_and_is_exposed_however_long_backward_is():
    # resnet18's 46.8 MB: buckets of 1 MiB, 25 MiB and the 19.5 MB left, that last one only once backward ends
    last = 46_800_000 - MB - DDP_BUCKET
    for compute in (1.2, 12.0):
        long = Measured(2, 46_800_000, data_s=0.01, compute_s=compute, exposed_s=0.02)
        assert exposed_s(long, Link(1e9)) == pytest.approx(last * 8 / 1e9)
        assert step_s(long, Link(1e9)) == pytest.approx(0.01 + compute + last * 8 / 1e9)
    # A short backward: the 25 MiB bucket is still on the link when backward ends, the last one waits for it.
    short = Measured(2, 46_800_000, data_s=0.0, compute_s=0.3, exposed_s=0.01)
    middle_done = 0.2 * (MB + DDP_BUCKET) / 46_800_000 + DDP_BUCKET * 8 / 1e9
    assert exposed_s(short, Link(1e9)) == pytest.approx(middle_done + last * 8 / 1e9 - 0.2)
    # never less than the run measured
    assert step_s(Measured(2, 1000, 0.0, 1.0, exposed_s=0.5), Link(1e9)) == pytest.approx(1.5)
    assert exposed_s(Measured(1, 46_800_000, 0.0, 1.0, 0.0), Link(1e9)) == 0.0


def test_a_script_on_the_horovod_api_is_forecast_as_ddp_and_horovod_as_horovod():
    measured = {backend: Measured(2, 46_800_000, 0.0, 1.2, 0.0, backend=backend)
                for backend in ("ddp", "horovod-api", "horovod")}
    assert exposed_s(measured["horovod-api"], Link(1e9)) == exposed_s(measured["ddp"], Link(1e9)) > 0
    assert exposed_s(measured["horovod"], Link(1e9)) == 0.0  # 0.37 s of wire inside 0.8 s of backward


def test_a_run_without_its_time_split_or_reduced_bytes_has_no_forecast():
    summary = {"world_size": 2, "backend": "ddp", "reduced_bytes_per_step": 4_000_000,
               "time_split": {"data_ms": 1.0, "compute_ms": 3.0, "comm_ms": 2.0, "step_ms": 6.0}}
    found = forecasts_ms(summary)
    assert list(found) == [link.describe() for link in REPORT_LINKS] == ["10 Gbit/s", "1 Gbit/s"]
    # DDP's two buckets: 1 MiB, ready early, then the rest, ready when backward's 2 ms end
    for link, ms_per_byte in (("1 Gbit/s", 8e-6), ("10 Gbit/s", 8e-7)):
        first_done = 2.0 * MB / 4_000_000 + MB * ms_per_byte
        exposed = max(first_done, 2.0) + (4_000_000 - MB) * ms_per_byte - 2.0
        assert found[link] == pytest.approx(1.0 + 3.0 + max(2.0, exposed))
    assert forecasts_ms({**summary, "reduced_bytes_per_step": None}) == {"10 Gbit/s": None, "1 Gbit/s": None}
    assert Measured.of({"time_split": {}, "reduced_bytes_per_step": 1}) is None
    assert Link(1e9, 5e-5).describe() == "1 Gbit/s, 50 µs" and Link(5e8).describe() == "500 Mbit/s"
