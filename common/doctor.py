"""python -m common.doctor: check, before a multi-host launch, everything that makes one fail or hang.

    python -m common.doctor [-H node0:4,node1:4] [--port 29500] [--ssh-port P] [--ssh-identity-file F]

One line per check, PASS or FAIL, and for each failure the fix; exit code 1 when any check failed.
Checks here: ssh to every other host (non-interactive, short timeout), this folder and this Python present
on each (launchers cd there and start it), the rendezvous port free on each host, and the network
interface that reaches the other hosts. The backends add their own through the
entry-point group `hvd_ddp_compare.doctor` (a module with CHECKS, run first, and PROBES, run last):
hvd_train checks Horovod's build and MPI, and runs a short allreduce between the hosts.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import errno
import ipaddress
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import launch
from .launch.hosts import DEFAULT_PORT, is_local, local_addresses, parse_hosts, resolve, route_to
from .errors import OneLineParser, print_error
from .launch.remote import SSH_CONNECT_TIMEOUT_S, SSH_OPTIONS

ENTRY_POINT_GROUP = "hvd_ddp_compare.doctor"


@dataclass
class Check:
    """The outcome of one check: passed (True), failed (False) or not run (None), and why."""

    name: str
    ok: Optional[bool]
    detail: str
    fix: str = ""

    def line(self) -> str:
        """One line for the terminal, with the fix on the next line when it failed."""
        status = {True: "PASS", False: "FAIL", None: "SKIP"}[self.ok]
        text = f"{status}  {self.name:<24} {self.detail}"
        if self.ok is False and self.fix:
            text += f"\n      fix: {self.fix}"
        return text


# --- checks ----------------------------------------------------------------------------------
def run_command(cmd: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None) -> Tuple[int, str]:
    """Exit code and combined output of a command run as a job of its own (common.launch); past `timeout`
    it is stopped and the code is 124; a program that cannot be started gives 127."""
    try:
        result = launch.run(cmd, timeout=timeout, env=env if env is not None else dict(os.environ))
    except OSError as exc:
        return 127, str(exc)
    if result.timed_out:
        return 124, (result.output.strip() + f"\nno answer within {timeout:.0f} s").strip()
    return result.returncode, result.output.strip()


def ssh_command(host: str, ssh_port: Optional[int], identity: Optional[str], remote: Sequence[str]) -> List[str]:
    """Non-interactive ssh to `host` that gives up after a short connect timeout."""
    cmd = ["ssh", *SSH_OPTIONS]
    if ssh_port:
        cmd += ["-p", str(ssh_port)]
    if identity:
        cmd += ["-i", identity]
    return cmd + [host, *remote]


def ssh_fix(host: str, error: str) -> str:
    """What to do about one ssh error message."""
    e = error.lower()
    if "could not resolve" in e or "name or service not known" in e:
        return f"{host} does not resolve: add it to /etc/hosts or DNS on this host"
    if "connection refused" in e:
        return f"nothing listens for ssh on {host}: start sshd there (systemctl start ssh), or pass --ssh-port"
    if "timed out" in e or "no route to host" in e or "network is unreachable" in e or "no answer" in e:
        return (f"{host} is down or unreachable: check it is up and on this network (ping {host}) and that "
                "no firewall blocks the ssh port")
    if "host key verification failed" in e:
        return f"{host}'s host key is unknown or changed: run `ssh {host}` once to accept it, or ssh-keyscan {host}"
    if "permission denied" in e:
        return (f"no passwordless login to {host}: ssh-keygen, then ssh-copy-id {host} (or pass "
                "--ssh-identity-file)")
    return f"make `ssh -o BatchMode=yes {host} true` work from this host"


def check_ssh(host: str, ssh_port: Optional[int], identity: Optional[str]) -> Check:
    """Passwordless, non-interactive ssh to `host` answers within seconds."""
    name = f"ssh {host}"
    started = time.monotonic()
    code, out = run_command(ssh_command(host, ssh_port, identity, ["true"]), timeout=SSH_CONNECT_TIMEOUT_S + 5)
    seconds = time.monotonic() - started
    if code != 0:
        error = out.splitlines()[-1] if out else f"ssh exited {code}"
        return Check(name, False, f"{error} (after {seconds:.1f} s)", ssh_fix(host, error))
    return Check(name, True, f"passwordless login in {seconds:.2f} s")


_PORT_FREE = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a rendezvous store binds it
try:
    s.bind(("", {port}))
except OSError as exc:
    print(exc)
    sys.exit(1)
"""


def port_holder(port: int) -> str:
    """', held by pid N (name)' for a listening socket on `port` of this host, if it can be seen."""
    import psutil

    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f", held by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except (psutil.Error, OSError) as exc:  # naming the holder is a courtesy: say why it is not named
        return f" (its holder cannot be named: {exc})"
    return ""


def check_port_here(port: int, host: str) -> Check:
    """The rendezvous port can be bound on this host."""
    name = f"port {port} on {host}"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
    except OSError as exc:
        holder = port_holder(port) if exc.errno == errno.EADDRINUSE else ""
        return Check(name, False, f"cannot be bound: {exc.strerror}{holder}",
                     f"stop what holds it, or choose a free port: --port N here, and --rdzv-endpoint {host}:N "
                     "for torchrun (or MASTER_PORT=N)")
    finally:
        sock.close()
    return Check(name, True, "free")


def check_port_remote(port: int, host: str, ssh_port: Optional[int], identity: Optional[str]) -> Check:
    """The rendezvous port can be bound on a remote host (checked with its python3 over ssh)."""
    name = f"port {port} on {host}"
    check = ["python3", "-c", shlex.quote(_PORT_FREE.format(port=port))]
    code, out = run_command(ssh_command(host, ssh_port, identity, check), timeout=SSH_CONNECT_TIMEOUT_S + 10)
    if code == 0:
        return Check(name, True, "free")
    if code == 1:
        return Check(name, False, f"cannot be bound: {out.splitlines()[-1] if out else 'in use'}",
                     f"stop what holds it on {host} (ss -ltnp 'sport = :{port}'), or choose a free port "
                     f"(--rdzv-endpoint HOST:N for torchrun)")
    return Check(name, None, f"not checked: {out.splitlines()[-1] if out else code}")


def check_paths_remote(host: str, folder: str, python: str, ssh_port: Optional[int], identity: Optional[str]) -> Check:
    """The folder the job runs in and this Python exist on a remote host (a launcher runs both there)."""
    name = f"paths on {host}"
    probe = f"for p in {shlex.quote(folder)} {shlex.quote(python)}; do [ -e \"$p\" ] || echo \"$p\"; done"
    code, out = run_command(ssh_command(host, ssh_port, identity, [probe]),
                            timeout=SSH_CONNECT_TIMEOUT_S + 10)
    if code != 0:
        return Check(name, None, f"not checked: {out.splitlines()[-1] if out else code}")
    missing = out.split()
    if missing:
        return Check(name, False, f"{host} has no {' and no '.join(missing)}",
                     f"install the project at the same path on every host (a shared filesystem, or the same "
                     f"checkout and `make setup` on {host}), and run from there")
    return Check(name, True, f"{folder} and {python} exist")


IFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME")


def check_interface(hosts: List[Tuple[str, int]], local: Dict[str, bool]) -> Tuple[Check, Optional[str]]:
    """The interface (and address) that reaches the other hosts, named; FAIL when there is no route, when
    this host's own name resolves to loopback (Gloo would listen there), or when an interface variable
    names an interface that does not exist. Also returns the interface's name when there is one."""
    name = "network interface"
    interfaces = local_addresses()
    names = set(interfaces.values())
    for var in IFACE_VARIABLES:
        wanted = os.environ.get(var)
        if wanted and not set(wanted.split(",")) <= names:
            return Check(name, False, f"{var}={wanted} but this host has only {', '.join(sorted(names))}",
                         f"unset {var} or set it to the interface that reaches the other hosts"), None
    remote = [h for h, _ in hosts if not local[h]]
    if not remote:
        return Check(name, True, "single host: processes talk over loopback (lo)"), None
    target = remote[0]
    addrs = resolve(target)
    if not addrs:
        return Check(name, False, f"{target} does not resolve", f"add {target} to /etc/hosts or DNS on this host"), None
    try:
        iface, source = route_to(addrs[0])
    except OSError as exc:
        return Check(name, False, f"no route to {target} ({addrs[0]}): {exc.strerror}",
                     f"connect this host to {target}'s network, or fix the routing table (ip route)"), None
    me = socket.gethostname()
    mine = resolve(me)
    if mine and all(ipaddress.ip_address(a).is_loopback for a in mine):
        return Check(name, False, f"this host's name {me} resolves to {mine[0]}; Gloo would listen on loopback",
                     f"export GLOO_SOCKET_IFNAME={iface} HOROVOD_GLOO_IFACE={iface} on every host, or map {me} to "
                     f"{source} in /etc/hosts"), None
    return Check(name, True, f"{iface} ({source}) reaches {target} ({addrs[0]})"), iface


# --- checks the backends add ------------------------------------------------------------------
#: a check of this machine's software, run before the others: () -> Check
EnvironmentCheck = Callable[[], Check]


@dataclass(frozen=True)
class Probe:
    """A check that runs something across the hosts, run last and only when nothing before it failed:
    run(hosts, ssh_port, identity_file, network_interface) -> Check."""

    name: str
    run: Callable[[List[Tuple[str, int]], Optional[int], Optional[str], Optional[str]], Check]


def plugin_checks() -> Tuple[List[EnvironmentCheck], List[Probe]]:
    """The CHECKS and PROBES of every module named under the entry-point group hvd_ddp_compare.doctor."""
    checks: List[EnvironmentCheck] = []
    probes: List[Probe] = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        module = entry.load()
        checks += list(getattr(module, "CHECKS", []))
        probes += list(getattr(module, "PROBES", []))
    return checks, probes


# --- the report ------------------------------------------------------------------------------
def run_checks(hosts: List[Tuple[str, int]], port: int, ssh_port: Optional[int], identity: Optional[str],
               probe: bool = True, out=None) -> List[Check]:
    """Run every check, print each line (to `out`, default stdout) as it is known, return them all. The
    paths checked on the other hosts are this folder and this Python: launchers run both there."""
    checks: List[Check] = []
    out = out or sys.stdout

    def report(check: Check) -> None:
        checks.append(check)
        print(check.line(), file=out, flush=True)

    local = {h: is_local(h) for h, _ in hosts}
    remote = [h for h, _ in hosts if not local[h]]
    environment_checks, probes = plugin_checks()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2 + len(environment_checks) + len(remote)) as pool:
        environment = [pool.submit(check) for check in environment_checks]
        ssh = {h: pool.submit(check_ssh, h, ssh_port, identity) for h in remote}
        for future in environment:
            report(future.result())
        reachable = []
        for h in remote:
            report(ssh[h].result())
            if checks[-1].ok:
                reachable.append(h)
    report(check_port_here(port, socket.gethostname()))
    for h in reachable:
        report(check_paths_remote(h, os.getcwd(), sys.executable, ssh_port, identity))
    for h in reachable:
        report(check_port_remote(port, h, ssh_port, identity))
    iface_check, iface = check_interface(hosts, local)
    report(iface_check)
    if probe:
        failed = [c.name for c in checks if c.ok is False and not c.name.startswith("port")]
        for check in probes:
            if failed:
                report(Check(check.name, None, f"not run: {', '.join(failed)} failed"))
            else:
                report(check.run(hosts, ssh_port, identity, iface))
    return checks


def build_parser() -> argparse.ArgumentParser:
    """The doctor's options (host list and ssh options as horovodrun spells them)."""
    parser = OneLineParser(
        prog="python -m common.doctor",
        description="Check that a multi-host launch can work: Horovod's build, MPI, ssh to every host, the "
                    "rendezvous port, the network interface and an allreduce between the hosts.")
    parser.add_argument("-H", "--hosts", default="localhost:2",
                        help="hosts and slots as for horovodrun, e.g. node0:4,node1:4")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="the rendezvous port (torchrun's --rdzv-endpoint)")
    parser.add_argument("--ssh-port", type=int, default=None, help="ssh port of the hosts, as horovodrun --ssh-port")
    parser.add_argument("--ssh-identity-file", default=None, help="ssh key, as horovodrun --ssh-identity-file")
    parser.add_argument("--no-allreduce", action="store_true",
                        help="skip the probes across hosts (the allreduce: saves ~10 s)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print one line per check; exit 1 if any failed, 2 on bad arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        hosts = parse_hosts(args.hosts)
    except ValueError as exc:
        print_error(parser.prog, str(exc), ranked=False)
        sys.exit(2)
    if not 0 < args.port < 65536:
        print_error(parser.prog, f"--port {args.port} is not a TCP port; pick one in 1024-65535", ranked=False)
        sys.exit(2)
    checks = run_checks(hosts, args.port, args.ssh_port, args.ssh_identity_file, probe=not args.no_allreduce)
    failed = [c for c in checks if c.ok is False]
    print(f"doctor: {len(failed)} of {len(checks)} checks failed" if failed else
          f"doctor: all {len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
