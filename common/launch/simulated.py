"""The two simulated hosts of one machine (built by tests/cluster.py): network namespaces `node0` and `node1` joined
by a veth pair, `eth0` on both sides. What the tests and the benchmarks share: the hosts' names and addresses, how a
command runs on a host, and the two ends of the link between them (common.launch.link shapes it)."""

from __future__ import annotations

import subprocess
from typing import List, Tuple

from .link import End

HOSTS = ("node0", "node1")
ADDRESSES = {"node0": "10.213.77.1", "node1": "10.213.77.2"}
PREFIX = 24
IFACE = "eth0"


def on_host(host: str, cmd: List[str]) -> List[str]:
    """`cmd` as run on `host`: in its network namespace (with its /etc/hosts and /etc/ssh) and under its host name.
    `ip netns exec` and `unshare` exec, so the pid is the command's own."""
    return ["ip", "netns", "exec", host, "unshare", "--uts", "--",
            "sh", "-c", f'hostname {host} && exec "$@"', "sh", *cmd]


def link_ends() -> Tuple[End, ...]:
    """Both ends of the link between the hosts: each host's eth0, so that shaping both holds both directions."""
    return tuple(End(host, IFACE) for host in HOSTS)


def hosts_up() -> bool:
    """Whether both hosts' namespaces exist (`python tests/cluster.py up` made them)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return set(HOSTS) <= {line.split()[0] for line in out.splitlines() if line.strip()}
