"""python -m common.doctor: check, before a multi-host launch, everything that makes one fail or hang.

    python -m common.doctor [-H node0:4,node1:4] [--port 29500] [--ssh-port P] [--ssh-identity-file F]

One line per check, PASS or FAIL, and for each failure the fix; exit code 1 when any check failed.
Checks: Horovod's build (PyTorch, Gloo, MPI), mpi4py and mpirun using the same MPI, ssh to every
other host (non-interactive, short timeout), the rendezvous port free on each host, the network
interface that reaches the other hosts, and a short allreduce between the hosts with its bandwidth.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import errno
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

SSH_CONNECT_TIMEOUT_S = 5
PROBE_TIMEOUT_S = 90
PROBE_MB = 4
PROBE_REPEATS = 5
PROBE_TAG = "doctor-probe"


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


# --- hosts -----------------------------------------------------------------------------------
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
    addrs = [info[4][0].split("%")[0] for info in infos]  # no IPv6 scope suffix (fe80::1%eth0)
    return sorted(set(addrs), key=lambda a: (":" in a, addrs.index(a)))


def is_local(host: str) -> bool:
    """True when `host` is this machine: its name, localhost, or an address of one of its interfaces."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    mine = local_addresses()
    return any(addr in mine or ipaddress.ip_address(addr).is_loopback for addr in resolve(host))


# --- checks ----------------------------------------------------------------------------------
def _run(cmd: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None) -> Tuple[int, str]:
    """Exit code and combined output of a command, in its own process group; when it runs longer than
    `timeout` the group gets SIGTERM (launchers stop their workers on it), then SIGKILL, and the code is 124."""
    try:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    except OSError as exc:
        return 127, str(exc)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out.strip()
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, _ = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                out = ""
        return 124, (out.strip() + f"\nno answer within {timeout:.0f} s").strip()


_HOROVOD_BUILD = """
import json
from hvd_train.backend import import_horovod
hvd = import_horovod()
import horovod
print(json.dumps({"version": horovod.__version__, "gloo": bool(hvd.gloo_built()),
                  "mpi": bool(hvd.mpi_built()), "nccl": bool(hvd.nccl_built())}))
"""


def check_horovod_build() -> Check:
    """horovod.torch imports against this torch and was built with Gloo and MPI."""
    name = "horovod build"
    code, out = _run([sys.executable, "-c", _HOROVOD_BUILD], timeout=60)
    rebuild = "run `make setup`, which builds horovod 0.28.1 against this torch with HOROVOD_WITH_PYTORCH=1 " \
              "HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1"
    if code != 0:
        return Check(name, False, f"horovod.torch does not load: {out.splitlines()[-1] if out else code}", rebuild)
    built = json.loads(out.splitlines()[-1])
    parts = ["PyTorch"] + [label for key, label in (("gloo", "Gloo"), ("mpi", "MPI"), ("nccl", "NCCL")) if built[key]]
    missing = [label for key, label in (("gloo", "Gloo"), ("mpi", "MPI")) if not built[key]]
    if missing:
        return Check(name, False, f"horovod {built['version']} built without {', '.join(missing)}", rebuild)
    return Check(name, True, f"horovod {built['version']} with {', '.join(parts)}")


_MPI4PY_LIBRARY = """
import mpi4py
mpi4py.rc.initialize = False  # the version is known without starting MPI
from mpi4py import MPI
print(MPI.Get_library_version().strip().strip(chr(0)).splitlines()[0])
"""


def mpi_identity(text: str) -> Tuple[Optional[str], Optional[str]]:
    """(vendor, version) from `mpirun --version` or MPI_Get_library_version text."""
    patterns = (("Open MPI", r"Open MPI\)?\s+v?(\d+(?:\.\d+)+)"), ("MPICH", r"MPICH.*?Version:\s*(\S+)"),
                ("MPICH", r"HYDRA.*?Version:\s*(\S+)"), ("Intel MPI", r"Intel\(R\) MPI Library\D*(\d+(?:\.\d+)*)"))
    for vendor, pattern in patterns:
        m = re.search(pattern, text, re.S)
        if m:
            return vendor, m.group(1)
    return None, None


def check_mpi() -> Check:
    """mpi4py loads the same MPI (vendor and version) as the mpirun on PATH."""
    name = "mpi4py vs mpirun"
    if not shutil.which("mpirun"):
        return Check(name, False, "mpirun is not on PATH",
                     "install OpenMPI (apt-get install openmpi-bin libopenmpi-dev) or put your MPI's bin/ on PATH")
    code, mpirun_text = _run(["mpirun", "--version"], timeout=20)
    code4py, lib_text = _run([sys.executable, "-c", _MPI4PY_LIBRARY], timeout=30)
    if code4py != 0:
        return Check(name, False, f"mpi4py does not load: {lib_text.splitlines()[-1] if lib_text else code4py}",
                     "pip install mpi4py (it must find the libmpi of the mpirun you launch with)")
    run_vendor, run_version = mpi_identity(mpirun_text)
    lib_vendor, lib_version = mpi_identity(lib_text)
    mpirun_path = shutil.which("mpirun")
    if (run_vendor, run_version) != (lib_vendor, lib_version) or run_vendor is None:
        return Check(name, False, f"mpi4py uses {lib_text!r} but {mpirun_path} is "
                                  f"{mpirun_text.splitlines()[0] if mpirun_text else 'unknown'!r}",
                     "put the MPI that mpi4py and Horovod were built with first on PATH and LD_LIBRARY_PATH, or "
                     "rebuild mpi4py against this one: pip install --force-reinstall --no-binary mpi4py mpi4py")
    return Check(name, True, f"both {run_vendor} {run_version} ({mpirun_path})")


def ssh_command(host: str, ssh_port: Optional[int], identity: Optional[str], remote: Sequence[str]) -> List[str]:
    """Non-interactive ssh to `host` that gives up after a short connect timeout."""
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}",
           "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=2"]
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
    code, out = _run(ssh_command(host, ssh_port, identity, ["true"]), timeout=SSH_CONNECT_TIMEOUT_S + 5)
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
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f", held by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except Exception:  # noqa: BLE001 - naming the holder is a courtesy
        pass
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
    code, out = _run(ssh_command(host, ssh_port, identity, ["python3", "-c", shlex.quote(_PORT_FREE.format(port=port))]),
                     timeout=SSH_CONNECT_TIMEOUT_S + 10)
    if code == 0:
        return Check(name, True, "free")
    if code == 1:
        return Check(name, False, f"cannot be bound: {out.splitlines()[-1] if out else 'in use'}",
                     f"stop what holds it on {host} (ss -ltnp 'sport = :{port}'), or choose a free port "
                     f"(--rdzv-endpoint HOST:N for torchrun)")
    return Check(name, None, f"not checked: {out.splitlines()[-1] if out else code}")


IFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME")


def route_source(address: str) -> str:
    """The local address the kernel would send from to reach `address` (a UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((address, 9))
        return sock.getsockname()[0]


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
        source = route_source(addrs[0])
    except OSError as exc:
        return Check(name, False, f"no route to {target} ({addrs[0]}): {exc.strerror}",
                     f"connect this host to {target}'s network, or fix the routing table (ip route)"), None
    iface = interfaces.get(source, "?")
    me = socket.gethostname()
    mine = resolve(me)
    if mine and all(ipaddress.ip_address(a).is_loopback for a in mine):
        return Check(name, False, f"this host's name {me} resolves to {mine[0]}; Gloo would listen on loopback",
                     f"export GLOO_SOCKET_IFNAME={iface} HOROVOD_GLOO_IFACE={iface} on every host, or map {me} to "
                     f"{source} in /etc/hosts"), None
    return Check(name, True, f"{iface} ({source}) reaches {target} ({addrs[0]})"), iface


# --- allreduce between the hosts -------------------------------------------------------------
def probe_hosts(hosts: List[Tuple[str, int]]) -> List[Tuple[str, int]]:
    """One process per host (the traffic between hosts is what is measured); two on a single host."""
    return [(h, 1) for h, _ in hosts] if len(hosts) > 1 else [(hosts[0][0], 2)]


def probe_command(hosts: List[Tuple[str, int]], ssh_port: Optional[int], identity: Optional[str],
                  iface: Optional[str]) -> List[str]:
    """horovodrun over Gloo, starting `python -m common.doctor --allreduce-probe` on every host."""
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(horovodrun):
        horovodrun = shutil.which("horovodrun") or "horovodrun"
    np = sum(slots for _, slots in hosts)
    cmd = [horovodrun, "-np", str(np), "-H", ",".join(f"{h}:{s}" for h, s in hosts), "--gloo",
           "--start-timeout", "60", "--disable-cache"]
    if ssh_port:
        cmd += ["--ssh-port", str(ssh_port)]
    if identity:
        cmd += ["--ssh-identity-file", identity]
    if iface:
        cmd += ["--network-interface", iface]
    return cmd + [sys.executable, "-m", "common.doctor", "--allreduce-probe"]


def check_allreduce(hosts: List[Tuple[str, int]], ssh_port: Optional[int], identity: Optional[str],
                    iface: Optional[str]) -> Check:
    """A few allreduces of a few MB across the hosts through horovodrun; their bandwidth."""
    hosts = probe_hosts(hosts)
    name = "allreduce"
    cmd = probe_command(hosts, ssh_port, identity, iface)
    env = dict(os.environ, PYTHONUNBUFFERED="1", HOROVOD_GLOO_TIMEOUT_SECONDS="60")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    started = time.monotonic()
    code, out = _run(cmd, timeout=PROBE_TIMEOUT_S, env=env)
    seconds = time.monotonic() - started
    result = None
    for line in out.splitlines():
        if PROBE_TAG in line:
            result = json.loads(line.split(PROBE_TAG, 1)[1])
    if code != 0 or result is None:
        last = [line for line in out.splitlines() if line.strip()][-3:]
        return Check(name, False, f"`{' '.join(cmd[:6])} ...` failed (exit {code} after {seconds:.0f} s): "
                                  f"{' | '.join(last) or 'no output'}",
                     "fix the failures above first; then run the probe command by hand to see its full output")
    where = ", ".join(h for h, _ in hosts)
    if not result["correct"]:
        return Check(name, False, f"allreduce over {where} returned a wrong sum",
                     "a broken network path or mismatched Horovod builds on the hosts: reinstall with `make setup` "
                     "on every host")
    return Check(name, True, f"{result['mb']:.0f} MB x {result['repeats']} over {result['size']} processes on {where}: "
                             f"{result['busbw_gbs']:.2f} GB/s bus bandwidth, {result['ms']:.1f} ms each "
                             f"(whole probe {seconds:.0f} s)")


def allreduce_probe() -> int:
    """Run as a Horovod worker: time allreduces of PROBE_MB and print the result on rank 0."""
    import torch

    from hvd_train.backend import HorovodBackend

    torch.set_num_threads(1)
    backend = HorovodBackend()
    backend.check_environment()
    backend.select_device("cpu")  # the probe's tensors live on CPU: it measures the network between hosts
    backend.init(timeout_s=60)
    hvd = backend.hvd
    size = hvd.size()
    tensor = torch.ones(PROBE_MB * 1024 * 1024 // 4)
    hvd.allreduce(tensor, op=hvd.Sum, name="doctor.warmup")
    times = []
    for i in range(PROBE_REPEATS):
        started = time.perf_counter()
        out = hvd.allreduce(tensor, op=hvd.Sum, name=f"doctor.{i}")
        times.append(time.perf_counter() - started)
    correct = bool(torch.all(out == size))
    if hvd.rank() == 0:
        seconds = sorted(times)[len(times) // 2]
        nbytes = tensor.numel() * 4
        # nccl-tests' bus bandwidth: what each link carries in a ring allreduce, comparable to link speed.
        busbw = 2 * (size - 1) / size * nbytes / seconds / 1e9
        print(PROBE_TAG + " " + json.dumps({"size": size, "mb": nbytes / 2**20, "repeats": PROBE_REPEATS,
                                            "ms": seconds * 1e3, "busbw_gbs": busbw, "correct": correct}),
              flush=True)
    backend.shutdown()
    return 0 if correct else 1


# --- the report ------------------------------------------------------------------------------
def run_checks(hosts: List[Tuple[str, int]], port: int, ssh_port: Optional[int], identity: Optional[str],
               probe: bool = True, out=None) -> List[Check]:
    """Run every check, print each line (to `out`, default stdout) as it is known, return them all."""
    checks: List[Check] = []
    out = out or sys.stdout

    def report(check: Check) -> None:
        checks.append(check)
        print(check.line(), file=out, flush=True)

    local = {h: is_local(h) for h, _ in hosts}
    remote = [h for h, _ in hosts if not local[h]]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4 + len(remote)) as pool:
        build = pool.submit(check_horovod_build)
        mpi = pool.submit(check_mpi)
        ssh = {h: pool.submit(check_ssh, h, ssh_port, identity) for h in remote}
        report(build.result())
        report(mpi.result())
        reachable = []
        for h in remote:
            report(ssh[h].result())
            if checks[-1].ok:
                reachable.append(h)
    report(check_port_here(port, socket.gethostname()))
    for h in reachable:
        report(check_port_remote(port, h, ssh_port, identity))
    iface_check, iface = check_interface(hosts, local)
    report(iface_check)
    if probe:
        failed = [c.name for c in checks if c.ok is False and not c.name.startswith("port")]
        if failed:
            report(Check("allreduce", None, f"not run: {', '.join(failed)} failed"))
        else:
            report(check_allreduce(hosts, ssh_port, identity, iface))
    return checks


def build_parser() -> argparse.ArgumentParser:
    """The doctor's options (host list and ssh options as horovodrun spells them)."""
    parser = argparse.ArgumentParser(
        prog="python -m common.doctor",
        description="Check that a multi-host launch can work: Horovod's build, MPI, ssh to every host, the "
                    "rendezvous port, the network interface and an allreduce between the hosts.")
    parser.add_argument("-H", "--hosts", default="localhost:2",
                        help="hosts and slots as for horovodrun, e.g. node0:4,node1:4")
    parser.add_argument("--port", type=int, default=29500, help="the rendezvous port (torchrun's --rdzv-endpoint)")
    parser.add_argument("--ssh-port", type=int, default=None, help="ssh port of the hosts, as horovodrun --ssh-port")
    parser.add_argument("--ssh-identity-file", default=None, help="ssh key, as horovodrun --ssh-identity-file")
    parser.add_argument("--no-allreduce", action="store_true", help="skip the allreduce probe (saves ~10 s)")
    parser.add_argument("--allreduce-probe", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print one line per check; exit 1 if any failed, 2 on bad arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.allreduce_probe:
        return allreduce_probe()
    try:
        hosts = parse_hosts(args.hosts)
    except ValueError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if not 0 < args.port < 65536:
        parser.exit(2, f"{parser.prog}: error: --port {args.port} is not a TCP port; pick one in 1024-65535\n")
    checks = run_checks(hosts, args.port, args.ssh_port, args.ssh_identity_file, probe=not args.no_allreduce)
    failed = [c for c in checks if c.ok is False]
    print(f"doctor: {len(failed)} of {len(checks)} checks failed" if failed else
          f"doctor: all {len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
