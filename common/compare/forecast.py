"""A backend's step time on another link, forecast from one measured run: the compute it measured, plus the
communication that link would leave exposed.

A step of a data-parallel run reduces its gradients (`reduced_bytes_per_step`, R) with ring allreduces: each of n
ranks sends and receives 2(n-1)/n x R bytes, in 2(n-1) rounds per collective. On a link of bandwidth B and latency L
that takes

    wire = 2(n-1)/n x R x 8 / B  +  collectives x 2(n-1) x L

Backward hides what it overlaps: gradients are reduced while the earlier layers still compute, so the window is
backward's time, taken as BACKWARD_SHARE of the measured compute (backward costs about twice forward), over which the
gradients come at an even rate. What the link has not carried when the window ends is exposed:

- Horovod fuses, every cycle, whatever came since the last: the link is busy from the first gradient on, and what
  is left when backward ends is wire - window.
- DDP hands the link a bucket once its last gradient came (the first 1 MiB, the others 25 MiB, in backward's order),
  one after the other: its last bucket starts only when backward ends, however fast the earlier ones went. A script
  on the project's Horovod API (backend `horovod-api`) forms the same buckets, so it is forecast as DDP.

and never less than the run measured:

    step(link) = data + compute + max(exposed measured, exposed(link))

A forecast says what the link would cost if nothing else changed; `benchmarks/link_speed.py` measures how far it lands
on shaped links.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

#: the share of a step's compute that backward takes, and so the window that communication can hide behind
BACKWARD_SHARE = 2 / 3
#: bytes a collective carries at most: DDP's bucket (its first bucket 1 MiB), Horovod's fusion buffer
DDP_BUCKET, DDP_FIRST_BUCKET, HOROVOD_FUSION = 25 * 2 ** 20, 2 ** 20, 64 * 2 ** 20


@dataclass(frozen=True)
class Link:
    """A link between hosts: bits per second, and seconds a message waits before its first byte arrives."""

    bandwidth_bits: float
    latency_s: float = 0.0

    def describe(self) -> str:
        """"1 Gbit/s", with the latency where it is not zero."""
        rate = (f"{self.bandwidth_bits / 1e9:g} Gbit/s" if self.bandwidth_bits >= 1e9
                else f"{self.bandwidth_bits / 1e6:g} Mbit/s")
        return rate + (f", {self.latency_s * 1e6:g} µs" if self.latency_s else "")


@dataclass(frozen=True)
class Measured:
    """What one run measured per step (seconds), and what it reduced."""

    world_size: int
    reduced_bytes: int
    data_s: float
    compute_s: float
    exposed_s: float
    backend: str = "ddp"

    @classmethod
    def of(cls, summary: Dict[str, Any]) -> Optional["Measured"]:
        """From a run's summary.json (its time split and reduced bytes); None where the run did not record them."""
        split = summary.get("time_split") or {}
        if summary.get("reduced_bytes_per_step") is None or split.get("compute_ms") is None:
            return None
        return cls(int(summary.get("world_size") or 1), int(summary["reduced_bytes_per_step"]),
                   (split.get("data_ms") or 0.0) / 1e3, split["compute_ms"] / 1e3, (split.get("comm_ms") or 0.0) / 1e3,
                   str(summary.get("backend") or "ddp"))


#: the backends whose gradients travel in DDP's buckets, each started once its last gradient came: DDP, and a
#: script on the project's Horovod API (its DistributedOptimizer forms DDP's buckets from its second step on)
DDP_BUCKETED = ("ddp", "horovod-api")


def collectives(reduced_bytes: int, backend: str) -> int:
    """How many collectives a step's gradients travel in: DDP's buckets, else Horovod's fused buffers."""
    if reduced_bytes <= 0:
        return 0
    if backend in DDP_BUCKETED:
        return len(ddp_buckets(reduced_bytes))
    return math.ceil(reduced_bytes / HOROVOD_FUSION)


def wire_s(measured: Measured, link: Link) -> float:
    """Seconds a step's ring allreduces take on `link`."""
    n = measured.world_size
    if n < 2:
        return 0.0
    volume = 2 * (n - 1) / n * measured.reduced_bytes * 8 / link.bandwidth_bits
    return volume + collectives(measured.reduced_bytes, measured.backend) * 2 * (n - 1) * link.latency_s


def ddp_buckets(reduced_bytes: int) -> List[int]:
    """The bytes of DDP's buckets in the order backward fills them: the first at most 1 MiB, then 25 MiB each, the
    last what remains."""
    sizes = [min(reduced_bytes, DDP_FIRST_BUCKET)] if reduced_bytes > 0 else []
    rest = reduced_bytes - sum(sizes)
    while rest > 0:
        sizes.append(min(rest, DDP_BUCKET))
        rest -= sizes[-1]
    return sizes


def exposed_s(measured: Measured, link: Link) -> float:
    """Seconds of `link`'s communication that backward's window does not hide (see the module's text)."""
    n = measured.world_size
    window = BACKWARD_SHARE * measured.compute_s
    if n < 2 or measured.reduced_bytes <= 0:
        return 0.0
    if measured.backend not in DDP_BUCKETED:
        return max(0.0, wire_s(measured, link) - window)
    per_byte, rounds = 2 * (n - 1) / n * 8 / link.bandwidth_bits, 2 * (n - 1) * link.latency_s
    done = came = 0.0
    for size in ddp_buckets(measured.reduced_bytes):
        came += size
        ready = window * came / measured.reduced_bytes  # the bucket's last gradient
        done = max(done, ready) + size * per_byte + rounds
    return max(0.0, done - window)


def step_s(measured: Measured, link: Link) -> float:
    """The step time `link` would give: data and compute as measured, and what backward's window leaves exposed."""
    return measured.data_s + measured.compute_s + max(measured.exposed_s, exposed_s(measured, link))


#: the links the comparison's report forecasts every run's step time at
REPORT_LINKS = (Link(10e9), Link(1e9))


def forecasts_ms(summary: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """A run's step time (ms) forecast at each of REPORT_LINKS, by the link's name; None where the run did not record
    what a forecast needs."""
    measured = Measured.of(summary)
    return {link.describe(): (1e3 * step_s(measured, link) if measured else None) for link in REPORT_LINKS}
