"""A two-host cluster on this one machine, for the multinode tests and the launch doctor's tests.

Hosts `node0` and `node1` are network namespaces joined by a veth pair (`eth0` on both, addresses
from a private test range that exist only inside the namespaces). Each host has:
- its own /etc/hosts and /etc/ssh (`ip netns exec` bind-mounts /etc/netns/<host>/* over /etc/*),
  so node0/node1 resolve on both and ssh needs no flags, as on a configured cluster;
- its own host name (every command runs under `unshare --uts` + `hostname <host>`), so
  socket.gethostname() differs between the hosts;
- its own sshd (Debian openssh-server) on port 22 of its namespace, with a host key and a client
  key made for this cluster in a temporary folder; root may log in with that key only.
Both hosts share the filesystem, so the same venv and run directories work on both.

    .venv/bin/python tests/cluster.py up      # build it and print how to use it (stays up)
    .venv/bin/python tests/cluster.py down    # remove it, and anything a crashed run left behind
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from common.launch.simulated import ADDRESSES, HOSTS, IFACE, PREFIX, on_host

NETNS_ETC = Path("/etc/netns")
SSHD = "/usr/sbin/sshd"
# Where the folder of the cluster that is up is recorded, so a later run can remove it.
STATE = Path(tempfile.gettempdir()) / "hvd-ddp-compare-cluster"


class ClusterUnavailable(Exception):
    """This machine does not allow network namespaces (the text says why)."""


def _sh(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a set-up command; on failure raise with its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def _namespaces() -> List[str]:
    out = _sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace_processes(host: str) -> None:
    """SIGKILL every process whose network namespace is `host` (sshd, workers, launchers)."""
    for _ in range(5):
        pids = [int(p) for p in _sh("ip", "netns", "pids", host, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def remove_leftovers() -> None:
    """Remove the namespaces, their processes, /etc/netns entries and the key folder of a cluster
    that an earlier run did not take down (killed test run, crash)."""
    present = set(_namespaces())
    for host in HOSTS:
        if host in present:
            _kill_namespace_processes(host)
            _sh("ip", "netns", "del", host, check=False)
        shutil.rmtree(NETNS_ETC / host, ignore_errors=True)
    if STATE.exists():
        folder = Path(STATE.read_text().strip())
        if folder.name.startswith("hvd-cluster-"):
            shutil.rmtree(folder, ignore_errors=True)
        STATE.unlink(missing_ok=True)


def check_namespaces_allowed() -> None:
    """Raise ClusterUnavailable with the system's own words if `ip netns add` is refused here."""
    probe = "hvdprobe"
    _sh("ip", "netns", "del", probe, check=False)
    proc = _sh("ip", "netns", "add", probe, check=False)
    if proc.returncode != 0:
        raise ClusterUnavailable(f"`ip netns add` failed: {(proc.stderr or proc.stdout).strip()}")
    _sh("ip", "netns", "del", probe, check=False)


SSHD_CONFIG = """\
# sshd of the simulated host {host}: root with the cluster's key only.
Port 22
ListenAddress 0.0.0.0
HostKey /etc/ssh/ssh_host_ed25519_key
PidFile {folder}/sshd-{host}.pid
AuthorizedKeysFile /etc/ssh/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
# horovodrun and mpirun open several connections at once.
MaxStartups 64:30:128
MaxSessions 64
LogLevel ERROR
"""

SSH_CONFIG = """\
# ssh client of the simulated hosts: the cluster's key, host keys known in advance.
Host *
    User root
    IdentityFile /etc/ssh/id_ed25519
    IdentitiesOnly yes
    GlobalKnownHostsFile /etc/ssh/ssh_known_hosts
    UserKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    LogLevel ERROR
"""


class Cluster:
    """node0 and node1, each with its own network stack, host name and sshd."""

    hosts = HOSTS
    addresses = ADDRESSES
    iface = IFACE

    def __init__(self) -> None:
        self.folder: Optional[Path] = None
        self.sshd: Dict[str, subprocess.Popen] = {}

    @property
    def home(self) -> Path:
        """The cluster's folder (keys, daemons' logs), while it is up."""
        if self.folder is None:
            raise RuntimeError("the cluster is not up")
        return self.folder

    # --- life cycle ----------------------------------------------------------------------
    def up(self) -> "Cluster":
        """Build the cluster (removing leftovers of an earlier one first) and wait for both sshds."""
        for tool in ("ip", "unshare", SSHD, "ssh", "ssh-keygen"):
            if not shutil.which(tool):
                raise RuntimeError(f"{tool} not found; run `make setup` (installs iproute2, openssh-server "
                                   "and openssh-client)")
        check_namespaces_allowed()
        remove_leftovers()
        self.folder = Path(tempfile.mkdtemp(prefix="hvd-cluster-"))
        STATE.write_text(str(self.folder))
        try:
            self._network()
            self._ssh_files()
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
            for host in HOSTS:
                self.start_sshd(host)
            for host in HOSTS:
                self.wait_for_ssh(host)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop the sshds and everything else running on the hosts, remove namespaces and files."""
        for host in list(self.sshd):
            self.stop_sshd(host)
        remove_leftovers()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _network(self) -> None:
        for host in HOSTS:
            _sh("ip", "netns", "add", host)
        # One veth pair, created directly inside the two namespaces, named eth0 on both sides:
        # Horovod's Gloo controller needs an interface name common to all hosts.
        _sh("ip", "link", "add", "name", IFACE, "netns", HOSTS[0], "type", "veth",
            "peer", "name", IFACE, "netns", HOSTS[1])
        for host in HOSTS:
            _sh("ip", "-n", host, "addr", "add", f"{ADDRESSES[host]}/{PREFIX}", "dev", IFACE)
            _sh("ip", "-n", host, "link", "set", IFACE, "up")
            _sh("ip", "-n", host, "link", "set", "lo", "up")

    def _ssh_files(self) -> None:
        folder = self.home
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cluster-client", "-f", str(folder / "id_ed25519"))
        known = []
        for host in HOSTS:
            etc = NETNS_ETC / host
            ssh = etc / "ssh"
            ssh.mkdir(parents=True)
            (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n" + "".join(
                f"{ADDRESSES[h]} {h}\n" for h in HOSTS))
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host, "-f", str(ssh / "ssh_host_ed25519_key"))
            pub = (ssh / "ssh_host_ed25519_key.pub").read_text().split()
            known.append(f"{host},{ADDRESSES[host]} {pub[0]} {pub[1]}\n")
            shutil.copy(folder / "id_ed25519", ssh / "id_ed25519")
            shutil.copy(folder / "id_ed25519.pub", ssh / "authorized_keys")
            (ssh / "id_ed25519").chmod(0o600)
            (ssh / "sshd_config").write_text(SSHD_CONFIG.format(host=host, folder=folder))
            (ssh / "ssh_config").write_text(SSH_CONFIG)
        for host in HOSTS:
            (NETNS_ETC / host / "ssh" / "ssh_known_hosts").write_text("".join(known))

    # --- sshd and links, for tests that take a host down ------------------------------------
    def start_sshd(self, host: str, hide: Optional[Path] = None) -> None:
        """Start host's sshd in the foreground (-D), logging to the cluster folder. With `hide`, sshd and
        every session it opens see an empty folder there (a tmpfs over it in a mount namespace of their
        own): a host that lacks a path the others have."""
        cmd = [SSHD, "-D", "-e", "-f", "/etc/ssh/sshd_config"]
        if hide is not None:
            cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   f'mount -t tmpfs hidden "{hide}" && exec "$@"', "sh", *cmd]
        log = open(self.home / f"sshd-{host}.log", "ab")
        self.sshd[host] = subprocess.Popen(on_host(host, cmd), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

    def stop_sshd(self, host: str) -> None:
        """Stop host's sshd (open sessions keep running until their commands end)."""
        proc = self.sshd.pop(host, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def set_link(self, host: str, up: bool) -> None:
        """Bring host's network interface down (the host drops off the network) or up again."""
        _sh("ip", "-n", host, "link", "set", IFACE, "up" if up else "down")

    def wait_for_ssh(self, host: str, timeout: float = 20) -> None:
        """Until `ssh host true` works from the other host (raise with sshd's log if it never does)."""
        other = next(h for h in HOSTS if h != host)
        deadline = time.monotonic() + timeout
        while True:
            proc = subprocess.run(on_host(other, ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2", host,
                                                  "true"]), capture_output=True, text=True, timeout=10)
            if proc.returncode == 0:
                return
            sshd = self.sshd.get(host)
            if time.monotonic() > deadline or (sshd is not None and sshd.poll() is not None):
                log = (self.home / f"sshd-{host}.log").read_text(errors="replace")
                raise RuntimeError(f"ssh {host} from {other} does not work: {proc.stderr.strip()}\nsshd log:\n{log}")
            time.sleep(0.2)

    # --- running commands on a host -----------------------------------------------------------
    def run(self, host: str, cmd: List[str], timeout: float = 240, env: Optional[Dict[str, str]] = None):
        """Run `cmd` on `host` as the tests run jobs (launched.run_cmd: venv on PATH, repo as cwd)."""
        from launched import run_cmd

        return run_cmd(on_host(host, cmd), timeout=timeout, env=env)

    def run_together(self, commands: Dict[str, List[str]], timeout: float = 240,
                     env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """Start one command on each named host at once (torchrun's one agent per node), wait for all;
        if any runs past `timeout`, every one is killed. Returns host -> launched.Result."""
        from common.launch import Job, JobTimeout
        from launched import REPO, Result, job_env

        jobs = {host: Job(on_host(host, cmd), env=job_env(env), cwd=REPO) for host, cmd in commands.items()}
        results = {}
        try:
            for host, job in jobs.items():
                code = job.wait(timeout=max(1.0, timeout - job.seconds))
                results[host] = Result(job.cmd, code, job.output, job.seconds)
        except JobTimeout:
            outputs = [f"--- {host}:\n{job.output[-3000:]}" for host, job in jobs.items()]
            raise AssertionError(f"not finished in {timeout}s:\n" + "\n".join(outputs)) from None
        finally:
            for job in jobs.values():
                job.stop()
        return results


@pytest.fixture(scope="session")
def cluster():
    """The cluster for the tests that use it, torn down after the last one (also when one fails).
    Skipped, with the system's reason, only where network namespaces are not allowed."""
    try:
        cluster = Cluster().up()
    except ClusterUnavailable as exc:
        pytest.skip(f"network namespaces are not allowed on this machine: {exc}")
    try:
        yield cluster
    finally:
        cluster.down()


def main(argv: List[str]) -> int:
    """`up` builds the cluster and leaves it up; `down` removes it and any leftovers."""
    if argv[:1] == ["down"]:
        remove_leftovers()
        return 0
    if argv[:1] == ["up"]:
        cluster = Cluster().up()
        for host in HOSTS:  # the sshds outlive this command; `down` kills them with their namespace
            cluster.sshd.pop(host)
        print(f"cluster up: {', '.join(f'{h} ({ADDRESSES[h]})' for h in HOSTS)}; run commands on a host with\n"
              f"  ip netns exec node0 unshare --uts sh -c 'hostname node0 && exec bash'\n"
              f"and remove it with: python {sys.argv[0]} down")
        return 0
    print(f"usage: python {sys.argv[0]} up|down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
