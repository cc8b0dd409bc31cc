"""Where the comparison's runs go: this host, a list of hosts (--hosts, as horovodrun -H spells it), or the
nodes of the Slurm allocation it runs in (--slurm). A site picks each backend's launcher and gives, for
one run, the command each host is to run, exactly as a user would type it there."""

from __future__ import annotations

import os
import subprocess
from typing import Dict, List, Optional, Sequence, Tuple

from .. import launch
from ..launch.hosts import parse_hosts, place, spell
from ..launch.placement import slurm_counts
from ..launch.remote import commands_for


class ThisHost:
    """Every run on this host, through the launchers a user starts here."""

    slurm = False

    def placement(self, np: int) -> Optional[str]:
        """The hosts the ranks of a run of `np` processes go on ("node0:4,node1:2"), None for this host."""
        return None

    def launcher(self, backend: str, controller: Optional[str]) -> launch.Launcher:
        """The launcher of `backend` (and Horovod controller) here."""
        return launch.find(backend, controller)

    def check(self, launchers: Sequence[launch.Launcher], world_sizes: Sequence[int]) -> None:
        """ValueError when one of these launchers cannot start one of these world sizes here."""

    def commands(self, launcher: launch.Launcher, np: int, args: Sequence[str], python: str,
                 index: int, module: Optional[str] = None) -> Dict[str, List[str]]:
        """host -> what that host runs for one run of `module` (default: the launcher's training module; see
        common.launch.remote.commands_for); `index` numbers the runs, so that each gets a rendezvous port of its
        own."""
        return commands_for(launcher, np, args, python=python, module=module)


class Hosts(ThisHost):
    """Runs across `spec` ("node0:4,node1:4"): each world size placed on the hosts in order, Horovod
    started from this host (horovodrun -H, mpirun --host), torchrun on every host it places ranks on, with
    the rendezvous on the first at `port` + the run's index."""

    def __init__(self, spec: str, port: int) -> None:
        self.hosts: List[Tuple[str, int]] = parse_hosts(spec)
        self.port = port

    def placement(self, np: int) -> Optional[str]:
        return spell(place(self.hosts, np))

    def check(self, launchers: Sequence[launch.Launcher], world_sizes: Sequence[int]) -> None:
        for np in world_sizes:
            placed = self.placement(np)  # ValueError when np does not fit
            for launcher in launchers:
                try:
                    launcher.command(np, python="python", hosts=placed, port=self.port)
                except ValueError as exc:
                    raise ValueError(f"--np {np} on --hosts {spell(self.hosts)} places {placed}: {exc}") from None

    def commands(self, launcher: launch.Launcher, np: int, args: Sequence[str], python: str,
                 index: int, module: Optional[str] = None) -> Dict[str, List[str]]:
        return commands_for(launcher, np, args, python=python, module=module, hosts=self.placement(np),
                            port=self.port + index)

    def used_hosts(self, world_sizes: Sequence[int]) -> List[Tuple[str, int]]:
        """The hosts that the largest world size places ranks on (every other size uses a prefix of them)."""
        return place(self.hosts, max(world_sizes))


class SlurmAllocation(Hosts):
    """Runs inside the Slurm allocation this process is in: srun for every run of both backends on the
    allocation's nodes (DDP: one task per process meeting at the first node; Horovod: its MPI controller
    wired up by PMI). Horovod's Gloo controller needs horovodrun, so it does not run here."""

    slurm = True

    def __init__(self, port: int, env: Optional[Dict[str, str]] = None) -> None:
        env = dict(os.environ if env is None else env)
        if "SLURM_JOB_ID" not in env:
            raise ValueError("--slurm runs inside a Slurm allocation: start it with salloc or in an sbatch script")
        nodes = node_names(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
        per_node = tasks_per_node(env, len(nodes))
        super().__init__(",".join(f"{node}:{slots}" for node, slots in zip(nodes, per_node, strict=True)), port)

    def launcher(self, backend: str, controller: Optional[str]) -> launch.Launcher:
        if controller == "gloo":
            raise ValueError("--slurm runs Horovod through srun with its MPI controller; Gloo needs horovodrun "
                             "(drop --hvd-controllers gloo)")
        return launch.find(backend, "mpi" if backend == "horovod" else None, slurm=True)


def node_names(nodelist: str) -> List[str]:
    """The allocation's node names from SLURM_JOB_NODELIST ("node[0-3]"), as `scontrol show hostnames`
    expands them."""
    if not nodelist:
        raise ValueError("SLURM_JOB_NODELIST is not set; --slurm runs inside a Slurm allocation")
    proc = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise ValueError(f"scontrol show hostnames {nodelist} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout.split()


def tasks_per_node(env: Dict[str, str], nodes: int) -> List[int]:
    """Processes each node may run: SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE ("4(x2),2"), else
    the CPUs Slurm gave each node."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return [int(env["SLURM_NTASKS_PER_NODE"])] * nodes
    counts = slurm_counts(env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE") or "")
    if len(counts) != nodes:
        raise ValueError(f"cannot tell how many tasks each of the {nodes} nodes runs; export "
                         "SLURM_NTASKS_PER_NODE (sbatch --ntasks-per-node N)")
    return counts
