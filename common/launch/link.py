"""A link between hosts shaped to a cluster's bandwidth, with Linux's own traffic control (`tc` from iproute2): a
token bucket (tbf) as the root queue of each end's interface, so that both directions are held to the rate.

Shaping needs CAP_NET_ADMIN where the interface lives; where the machine refuses it, `ShapingRefused` says so in one
line, and nothing runs unshaped in its place. `shaped()` undoes the shaping when its block ends, also when the block
raised or was interrupted.

    with shaped([End("node0", "eth0"), End("node1", "eth0")], SETTINGS["1gbit"]):
        ...  # the runs
"""

from __future__ import annotations

import json
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

#: how long a packet may wait in the bucket's queue before it is dropped (tbf's `latency`): long enough that TCP
#: sees a slow link, not a lossy one
QUEUE_LATENCY = "100ms"
#: the bucket's depth: at least one 64 KiB segment (veth passes segments up to that size whole), and a millisecond
#: of the rate above that, so that the kernel's timer does not cap the rate below the one set
MIN_BURST_BYTES = 256 * 1024


@dataclass(frozen=True)
class LinkSetting:
    """A link's shape: its name and rate in bits per second (None: left as the kernel made it)."""

    name: str
    rate_bits: Optional[float]

    def describe(self) -> str:
        """"1 Gbit/s", or "unshaped"."""
        if self.rate_bits is None:
            return "unshaped"
        gbit = self.rate_bits / 1e9
        return f"{gbit:g} Gbit/s" if gbit >= 1 else f"{self.rate_bits / 1e6:g} Mbit/s"


SETTINGS = {setting.name: setting for setting in (
    LinkSetting("unshaped", None), LinkSetting("10gbit", 10e9), LinkSetting("1gbit", 1e9))}


@dataclass(frozen=True)
class End:
    """One end of the link: an interface, in a network namespace (None: this process's own)."""

    namespace: Optional[str]
    interface: str

    def command(self, *tc: str) -> List[str]:
        """`tc ...` run where this end lives."""
        inside = ["ip", "netns", "exec", self.namespace] if self.namespace else []
        return [*inside, "tc", *tc]

    def __str__(self) -> str:
        return f"{self.namespace}:{self.interface}" if self.namespace else self.interface


class ShapingRefused(RuntimeError):
    """This machine will not shape the link (no tc, or no CAP_NET_ADMIN): the message is one line with the fix."""


def bucket_options(rate_bits: float) -> List[str]:
    """tbf's options for `rate_bits`: the rate, a bucket of at least MIN_BURST_BYTES or a millisecond of the rate,
    and QUEUE_LATENCY of queue."""
    burst = max(MIN_BURST_BYTES, int(rate_bits / 8 / 1000))
    return ["rate", f"{int(rate_bits)}bit", "burst", str(burst), "latency", QUEUE_LATENCY]


def _tc(end: End, *args: str) -> subprocess.CompletedProcess:
    if shutil.which("tc") is None:
        raise ShapingRefused("tc is not installed: install iproute2 (apt-get install iproute2) to shape the link")
    return subprocess.run(end.command(*args), capture_output=True, text=True, timeout=30)


def shape(end: End, setting: LinkSetting) -> None:
    """Hold `end`'s outgoing traffic to the setting's rate (an unshaped setting clears it instead)."""
    if setting.rate_bits is None:
        clear(end)
        return
    done = _tc(end, "qdisc", "replace", "dev", end.interface, "root", "tbf", *bucket_options(setting.rate_bits))
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[0] if (done.stderr or done.stdout).strip() else ""
        if "not permitted" in why.lower() or "permission" in why.lower():
            raise ShapingRefused(f"cannot shape {end} to {setting.describe()}: tc needs CAP_NET_ADMIN ({why}); run as "
                                 "root, or in a container started with --cap-add NET_ADMIN")
        raise ShapingRefused(f"cannot shape {end} to {setting.describe()}: tc said: {why}")


def clear(end: End) -> None:
    """Give `end` back its default queue (nothing to clear is not an error)."""
    _tc(end, "qdisc", "del", "dev", end.interface, "root")


def root_queue(end: End) -> str:
    """The kind of `end`'s root queue: "tbf" while shaped; the kernel's default otherwise ("noqueue" on a veth)."""
    done = _tc(end, "-j", "qdisc", "show", "dev", end.interface)
    if done.returncode != 0:
        raise ShapingRefused(f"cannot read {end}'s queue: {done.stderr.strip()}")
    roots = [q for q in json.loads(done.stdout or "[]") if q.get("root")]
    return roots[0]["kind"] if roots else "none"


def sent_bytes(end: End) -> int:
    """Bytes `end`'s root queue has sent since it was set up."""
    done = _tc(end, "-s", "-j", "qdisc", "show", "dev", end.interface)
    roots = [q for q in json.loads(done.stdout or "[]") if q.get("root")]
    return int(roots[0].get("bytes", 0)) if roots else 0


@contextmanager
def shaped(ends: Sequence[End], setting: LinkSetting) -> Iterator[LinkSetting]:
    """Shape every end to `setting` for the block, and undo it when the block ends, however it ends."""
    try:
        for end in ends:
            shape(end, setting)
        yield setting
    finally:
        for end in ends:
            clear(end)
