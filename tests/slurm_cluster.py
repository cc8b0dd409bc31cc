"""A Slurm cluster on the two simulated hosts of tests/cluster.py, for the tests of the sbatch templates,
`compare-backends --slurm` and Slurm's faults.

Debian's Slurm (slurmctld, slurmd, munge): munged and slurmctld on node0, a slurmd on node0 and on node1, each
daemon in its host's network namespace under its host's name, as sshd runs there. The configuration is made
for this cluster in its folder and given to the hosts as their /etc/slurm (/etc/netns/<host>/slurm, which `ip
netns exec` mounts there), so sbatch, srun, salloc, scontrol and scancel on a host need no option to find it.

    .venv/bin/python tests/slurm_cluster.py up      # the two hosts with Slurm running (stays up)
    .venv/bin/python tests/slurm_cluster.py down    # remove it, and anything a crashed run left behind
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from cluster import ADDRESSES, HOSTS, NETNS_ETC, Cluster, ClusterUnavailable, on_host, remove_leftovers
from launched import Result

CONTROLLER = HOSTS[0]
#: the slots of each host: the tests run up to 2 tasks per node (4 ranks across both); the machine's 2 cores
CPUS_PER_NODE = 2
#: seconds between the SIGTERM and the SIGKILL of a job's processes when it ends (scancel, time limit, a failed
#: node); Slurm's default is 30
KILL_WAIT_S = 10
#: seconds without an answer after which slurmctld sets a node DOWN and ends its jobs (Slurm's default is 300).
#: slurmctld pings every third of it, so a node that drops off is DOWN 2/3 to 4/3 of it later: after the ranks'
#: own --timeout in the tests, so that the ranks name who is missing before Slurm ends the job
SLURMD_TIMEOUT_S = 30

SLURM_CONF = """\
# slurm.conf of the simulated two-host cluster (tests/slurm_cluster.py), Debian's Slurm {version}.
ClusterName=hvdddp
SlurmctldHost={controller}({controller_address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# The one munged, on {controller}: its socket is a file, and the hosts share the filesystem.
AuthInfo=socket={folder}/munge-run/munge.socket
StateSaveLocation={folder}/slurmctld
SlurmctldPidFile={folder}/slurmctld.pid
SlurmctldLogFile={folder}/slurmctld.log
# Both slurmds share one filesystem: their spool, pid and log files are per node (%n), and so is TmpFS, where
# the PMIx plugin makes each step's client folder (spmix_appdir_JOB.STEP), named the same on every node.
SlurmdSpoolDir={folder}/slurmd-%n
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmdLogFile={folder}/slurmd-%n.log
TmpFS={folder}/tmp-%n
# No cgroups: `ip netns exec` mounts a fresh /sys for the host's namespace, without a cgroup hierarchy (and one
# hierarchy for two slurmds on one machine would mix their jobs). So processes are tracked by ancestry
# (proctrack/linuxproc: a process whose parent exits escapes it, which is why the templates exec srun), tasks are
# neither bound nor confined (task/none), and nothing is measured per job (jobacct_gather/none). cgroup.conf names
# cgroup/v1 only because slurmd loads a cgroup plugin at start whatever the others are, and autodetection finds
# no /sys/fs/cgroup; no plugin here uses it.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# MPI plugins of Debian's build (srun --mpi=list): pmix (pmix_v4, PMIx 4), pmi2, cray_shasta, none. Tasks get no
# PMI unless srun asks: Horovod's template passes --mpi=pmix, the one Debian's Open MPI also speaks.
MpiDefault=none
# Finished jobs are forgotten after 4 s, so that sbatch --wait polls every 2 s (it polls less often, up to every
# 32 s, while a job could still be remembered for MinJobAge / 2 more).
MinJobAge=4
KillWait={kill_wait}
SlurmdTimeout={slurmd_timeout}
# A node that answers again after it was set DOWN for not answering is back in service at once.
ReturnToService=2
# Job ids from the clock (ten a second, below MaxJobId), so that no earlier cluster's runs/slurm-<job id> is reused.
FirstJobId={first_job_id}
{nodes}PartitionName=hosts Nodes={partition_nodes} Default=YES MaxTime=INFINITE State=UP
"""

CGROUP_CONF = """\
# slurmd loads a cgroup plugin at start; nothing here uses it (slurm.conf says why).
CgroupPlugin=cgroup/v1
"""


@dataclass(frozen=True)
class NodeState:
    """One node as sinfo reports it."""

    name: str
    state: str  # idle, mixed, allocated, down*, ...


class SlurmCluster:
    """munged and slurmctld on node0, slurmd on node0 and node1, on a running `Cluster`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.folder = cluster.home / "slurm"
        self.daemons: Dict[str, subprocess.Popen] = {}

    # --- life cycle ----------------------------------------------------------------------------
    def up(self, timeout: float = 60) -> "SlurmCluster":
        """Write the configuration, start the daemons and wait until both nodes take jobs."""
        for tool in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch"):
            if not shutil.which(tool):
                raise RuntimeError(f"{tool} not found; run `make setup` (installs munge, slurmctld, slurmd and "
                                   "slurm-client)")
        try:
            self._configure()
            # --force: munged wants the folders above its socket open to every user, and the cluster's folder is
            # root's alone (it holds the keys); every client here is root.
            self._start("munged", CONTROLLER, ["munged", "--foreground", "--force",
                                               f"--key-file={self.folder}/munge/munge.key",
                                               f"--socket={self.folder}/munge-run/munge.socket",
                                               f"--pid-file={self.folder}/munge-run/munged.pid",
                                               f"--seed-file={self.folder}/munge/munged.seed"])
            self._wait_for_file(self.folder / "munge-run" / "munge.socket", "munged")
            # -c: no state of an earlier cluster; -D: in the foreground, so that stopping the process stops it.
            self._start("slurmctld", CONTROLLER, ["slurmctld", "-D", "-c"])
            for host in HOSTS:
                self._start(f"slurmd-{host}", host, ["slurmd", "-D"])
            self.wait_until_idle(timeout)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop the daemons (SIGTERM, SIGKILL to those still running 5 s later) and remove the configuration. Job
        steps still running end with the hosts (Cluster.down kills every process of their namespaces)."""
        for proc in self.daemons.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.daemons.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.daemons.clear()
        for host in HOSTS:
            shutil.rmtree(NETNS_ETC / host / "slurm", ignore_errors=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _configure(self) -> None:
        """slurm.conf, cgroup.conf, the munge key and the daemons' folders."""
        self.folder.mkdir()
        (self.folder / "munge").mkdir(mode=0o700)  # the key, root's alone
        (self.folder / "munge-run").mkdir(mode=0o755)  # the socket, open to every user
        _run(["mungekey", "--create", f"--keyfile={self.folder}/munge/munge.key"])
        for sub in ["slurmctld", *(f"slurmd-{h}" for h in HOSTS), *(f"tmp-{h}" for h in HOSTS)]:
            (self.folder / sub).mkdir()
        nodes = "".join(f"NodeName={host} NodeAddr={ADDRESSES[host]} CPUs={CPUS_PER_NODE} State=UNKNOWN\n"
                        for host in HOSTS)
        conf = SLURM_CONF.format(version=version(), controller=CONTROLLER, controller_address=ADDRESSES[CONTROLLER],
                                 folder=self.folder, kill_wait=KILL_WAIT_S, slurmd_timeout=SLURMD_TIMEOUT_S,
                                 nodes=nodes, partition_nodes=",".join(HOSTS),
                                 first_job_id=int(time.time()) % 6_000_000 * 10 + 1)
        for host in HOSTS:
            etc = NETNS_ETC / host / "slurm"
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "slurm.conf").write_text(conf)
            (etc / "cgroup.conf").write_text(CGROUP_CONF)

    def _start(self, name: str, host: str, cmd: List[str]) -> None:
        log = open(self.folder / f"{name}.out", "ab")
        self.daemons[name] = subprocess.Popen(on_host(host, cmd), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

    def _wait_for_file(self, path: Path, name: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.daemons[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{self.log(name)}")
            time.sleep(0.05)

    # --- state ---------------------------------------------------------------------------------
    def log(self, name: str) -> str:
        """What a daemon printed (munged, slurmctld, slurmd-node0, ...) and its log file."""
        texts = []
        for path in (self.folder / f"{name}.out", self.folder / f"{name}.log"):
            if path.exists():
                texts.append(path.read_text(errors="replace")[-4000:])
        return "\n".join(texts)

    def nodes(self) -> List[NodeState]:
        """Every node and its state, as sinfo on node0 reports them ([] while slurmctld does not answer)."""
        proc = subprocess.run(on_host(CONTROLLER, ["sinfo", "--noheader", "--Node", "--format=%N %T"]),
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            return []
        return [NodeState(*line.split()[:2]) for line in proc.stdout.splitlines() if line.strip()]

    def wait_until_idle(self, timeout: float = 60) -> None:
        """Until both nodes are idle: no job left on them, and a node that was set DOWN (its link was cut) back in
        service. Raises with the daemons' logs if they never are."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.nodes()
            if len(states) == len(HOSTS) and all(n.state == "idle" for n in states):
                return
            dead = [name for name, proc in self.daemons.items() if proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {name}:\n{self.log(name)}" for name in self.daemons)
                raise RuntimeError(f"Slurm's nodes are not idle ({states or 'slurmctld does not answer'}"
                                   f"{'; stopped: ' + ', '.join(dead) if dead else ''}):\n{logs}")
            time.sleep(0.5)

    def step_daemons(self, job: str, within: float = 0) -> List[str]:
        """The slurmstepd processes of job `job` still running on the hosts ("slurmstepd: [12.batch]", one per
        step and node), once none is left or `within` seconds have passed."""
        deadline = time.monotonic() + within
        while True:
            found = []
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    try:
                        title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                    except OSError:
                        continue
                    if title.startswith(f"slurmstepd: [{job}."):
                        found.append(title)
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    # --- running Slurm's commands ------------------------------------------------------------------
    def run(self, cmd: List[str], timeout: float = 240, env: Optional[Dict[str, str]] = None,
            host: str = CONTROLLER) -> Result:
        """`cmd` (sbatch, salloc, scancel, ...) on `host` (node0, the login node), as the tests run jobs."""
        return self.cluster.run(host, cmd, timeout=timeout, env=env)


def version() -> str:
    """Slurm's version ("22.05.8"), as slurmd reports it."""
    return _run(["slurmd", "-V"]).stdout.split()[-1]


def submitted_job(output: str) -> str:
    """The job id sbatch printed ("Submitted batch job 12")."""
    found = re.search(r"Submitted batch job (\d+)", output)
    if not found:
        raise AssertionError(f"sbatch submitted no job:\n{output[-3000:]}")
    return found[1]


def _run(cmd: List[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
    return proc


@pytest.fixture(scope="session")
def slurm(cluster) -> Iterator[SlurmCluster]:
    """Slurm on the cluster for the tests that use it, stopped after the last one (also when one fails)."""
    slurm = SlurmCluster(cluster).up()
    try:
        yield slurm
    finally:
        slurm.down()


def main(argv: List[str]) -> int:
    """`up` builds the two hosts and starts Slurm on them; `down` removes both and any leftovers."""
    if argv[:1] == ["down"]:
        remove_leftovers()
        return 0
    if argv[:1] == ["up"]:
        try:
            cluster = Cluster().up()
        except ClusterUnavailable as exc:
            print(f"network namespaces are not allowed on this machine: {exc}", file=sys.stderr)
            return 1
        try:
            slurm = SlurmCluster(cluster).up()
        except BaseException:
            cluster.down()
            raise
        # The daemons outlive this command; `down` kills them with their namespaces.
        cluster.sshd.clear()
        slurm.daemons.clear()
        print(f"Slurm {version()} up on {', '.join(HOSTS)}; on a host, e.g.\n"
              f"  ip netns exec node0 unshare --uts sh -c 'hostname node0 && exec bash'\n"
              f"  sinfo; sbatch --wait --nodes 2 --ntasks-per-node 1 --cpus-per-task 1 slurm/ddp_srun.sbatch\n"
              f"and remove it with: python {sys.argv[0]} down")
        return 0
    print(f"usage: python {sys.argv[0]} up|down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
