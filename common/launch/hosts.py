"""Host lists as horovodrun's -H spells them, where a number of processes goes on them, and whether a
host is this machine."""

from __future__ import annotations

import ipaddress
import socket
from typing import Dict, List, Tuple

#: the rendezvous port across hosts when none is given: torchrun's own default (--master-port, --rdzv-endpoint)
DEFAULT_PORT = 29500


def parse_hosts(spec: str) -> List[Tuple[str, int]]:
    """horovodrun's -H syntax, 'node0:4,node1:4' -> [('node0', 4), ('node1', 4)] (slots default 1)."""
    hosts = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, slots = part.partition(":")
        if not name or (slots and not slots.isdigit()) or (slots and int(slots) < 1):
            raise ValueError(f"bad host entry {part!r} in -H {spec!r}; write host:slots, e.g. node0:4,node1:4")
        hosts.append((name, int(slots) if slots else 1))
    if not hosts:
        raise ValueError(f"-H {spec!r} names no host; write host:slots, e.g. node0:4,node1:4")
    return hosts


def local_addresses() -> Dict[str, str]:
    """Every address of this host's interfaces -> the interface's name."""
    import psutil

    return {a.address.split("%")[0]: name for name, addrs in psutil.net_if_addrs().items()
            for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)}


def resolve(host: str) -> List[str]:
    """The addresses `host` resolves to here (IPv4 first), or [] when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    addrs = [str(info[4][0]).split("%")[0] for info in infos]  # no IPv6 scope suffix (fe80::1%eth0)
    return sorted(set(addrs), key=lambda a: (":" in a, addrs.index(a)))


def route_to(address: str) -> Tuple[str, str]:
    """(interface, local address) the kernel would send from to reach `address` (a UDP connect sends
    nothing); OSError when there is no route."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((address, 9))
        source = sock.getsockname()[0]
    return local_addresses().get(source, "?"), source


def is_local(host: str) -> bool:
    """True when `host` is this machine: its name, localhost, or an address of one of its interfaces."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    mine = local_addresses()
    return any(addr in mine or ipaddress.ip_address(addr).is_loopback for addr in resolve(host))


def place(hosts: List[Tuple[str, int]], np: int) -> List[Tuple[str, int]]:
    """`np` processes on `hosts` in order, each host filled to its slots before the next is used:
    ([("node0", 4), ("node1", 4)], 6) -> [("node0", 4), ("node1", 2)]. ValueError when they do not fit."""
    placed, left = [], np
    for name, slots in hosts:
        if left <= 0:
            break
        placed.append((name, min(slots, left)))
        left -= slots
    if left > 0:
        total = sum(slots for _, slots in hosts)
        raise ValueError(f"{np} processes do not fit on {spell(hosts)} ({total} slots); add hosts or slots")
    return placed


def spell(hosts: List[Tuple[str, int]]) -> str:
    """[("node0", 4), ("node1", 4)] -> "node0:4,node1:4"."""
    return ",".join(f"{name}:{slots}" for name, slots in hosts)
