"""The start of a generation (hvd.init()'s first step) and hvd.shutdown(), and who this process is in the job.

The first init() joins the job on torch.distributed: the rendezvous is ddp_train's own (DDPBackend: torchrun's
variables, or Slurm's and Open MPI's with MASTER_ADDR/MASTER_PORT), then the API makes process groups of its own
(Gloo, and NCCL where there is CUDA), starts rank 0's coordinator and every rank's engine, and learns the hosts of the
ranks (local and cross ranks, as Horovod computes them). shutdown() ends one init's collectives on every rank (as
Horovod's does) but keeps all of that, so that a later init() starts again at once: a process joins the job once.

hvd.init() itself is mpi_ops.init (as in Horovod): this module's init(), then the process sets given to it, then the
timeline HOROVOD_TIMELINE names. This module keeps the one registry of the process sets that exist (State.sets),
which the engine thread changes as the coordinator adds and removes sets; process_sets.py reads it.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from common.errors import UsageError, fail_usage
from common.launch.placement import detect
from ddp_train.backend import DDPBackend

from . import coordinator as coordination
from . import timeline
from .cycle import RankCycle
from .dispatch import Dispatcher
from .engine import Engine
from .engine_core import Counts, EngineCore
from .exceptions import NOT_INITIALIZED
from .execute import Communicator, agree
from .handles import HandleTable
from .messages import ADD_SET, Channel, Response
from .settings import Settings

PROG = "horovod_api"
#: seconds shutdown() waits for this rank's collectives in flight to finish
SHUTDOWN_WAIT_S = 30.0


@dataclass(frozen=True)
class Topology:
    """Ranks as Horovod numbers them: local among the processes of a host, cross among the hosts that have a
    process of the same local rank."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    homogeneous: bool

    @classmethod
    def from_hosts(cls, hosts: Sequence[str], rank: int) -> "Topology":
        """The topology of rank `rank` from every rank's host name, in rank order."""
        mine = hosts[rank]
        local = [r for r, host in enumerate(hosts) if host == mine]
        local_rank = local.index(rank)
        per_host: Dict[str, List[int]] = {}
        for r, host in enumerate(hosts):
            per_host.setdefault(host, []).append(r)
        # Hosts in the order of their first rank; cross peers: the ranks with this local rank, one per host.
        peers = [ranks[local_rank] for ranks in per_host.values() if len(ranks) > local_rank]
        sizes = {len(ranks) for ranks in per_host.values()}
        return cls(rank, len(hosts), local_rank, len(local), peers.index(rank), len(peers), len(sizes) == 1)


@dataclass
class World:
    """What the first init() builds, kept for the process: the groups, the coordinator, the engine."""

    topology: Topology
    settings: Settings
    everyone: Communicator
    engine: Engine
    coordinator: Optional[coordination.Coordinator]
    groups: Dict[Tuple[int, ...], Communicator] = field(default_factory=dict)


@dataclass
class State:
    """One init() of the API: its generation, settings, process sets and handles. `sets` is the registry of the
    process sets that exist, by id (0: the global set), each with its ranks and groups."""

    world: Optional[World] = None
    gen: int = 0
    initialized: bool = False
    settings: Settings = field(default_factory=Settings)
    sets: Dict[int, Communicator] = field(default_factory=dict)
    handles: HandleTable = field(default_factory=HandleTable)
    join_device: int = -1
    ended_elsewhere: bool = False  # another rank's shutdown (or a stall) ended this generation while in it


STATE = State()


def _group(ranks: List[int], backend: str, timeout_s: float):
    return dist.new_group(ranks=ranks, backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def _communicator(ranks: List[int], rank: int, settings: Settings) -> Communicator:
    """The groups of a set of ranks (made on every rank of the job, as torch.distributed requires)."""
    cpu = _group(ranks, "gloo", settings.collective_timeout_s)
    cuda = _group(ranks, "nccl", settings.collective_timeout_s) if _cuda_collectives() else None
    member = rank in ranks
    return Communicator(list(ranks), ranks.index(rank) if member else -1, cpu if member else None,
                        cuda if member else None)


def _cuda_collectives() -> bool:
    return torch.cuda.is_available() and dist.is_nccl_available()


def _join_job(settings: Settings) -> None:
    """torch.distributed's default group, through ddp_train's rendezvous (unless the script made one itself)."""
    if dist.is_initialized():
        return
    backend = DDPBackend()
    try:
        backend.check_environment()
        backend.init(settings.collective_timeout_s)
    except UsageError as exc:
        fail_usage(PROG, str(exc))


def _export(topology: Topology) -> None:
    """The variables horovodrun gives its ranks, for scripts (and Horovod's tests) that read them."""
    values = {"HOROVOD_RANK": topology.rank, "HOROVOD_SIZE": topology.size, "HOROVOD_LOCAL_RANK": topology.local_rank,
              "HOROVOD_LOCAL_SIZE": topology.local_size, "HOROVOD_CROSS_RANK": topology.cross_rank,
              "HOROVOD_CROSS_SIZE": topology.cross_size}
    for name, value in values.items():
        os.environ[name] = str(value)


def export_placement() -> None:
    """Before the script starts: the HOROVOD_* rank variables from what the launcher set (torchrun's GROUP_RANK and
    GROUP_WORLD_SIZE give the cross rank and size; init() sets them all from the hosts of the ranks)."""
    placement = detect()
    cross = (os.environ.get("GROUP_RANK", "0"), os.environ.get("GROUP_WORLD_SIZE", "1"))
    values = {"HOROVOD_RANK": placement.rank, "HOROVOD_SIZE": placement.world_size,
              "HOROVOD_LOCAL_RANK": placement.local_rank, "HOROVOD_LOCAL_SIZE": placement.local_world_size,
              "HOROVOD_CROSS_RANK": cross[0], "HOROVOD_CROSS_SIZE": cross[1]}
    for name, value in values.items():
        os.environ.setdefault(name, str(value))


def _read_settings() -> Settings:
    try:
        return Settings.from_environment()
    except ValueError as exc:  # a Horovod variable that is not a number: bad input, on every rank
        fail_usage(PROG, str(exc))


def _build_world(settings: Settings) -> World:
    _join_job(settings)
    rank, size = dist.get_rank(), dist.get_world_size()
    everyone = _communicator(list(range(size)), rank, settings)
    places: List[Optional[Tuple[str, int]]] = [None] * size
    dist.all_gather_object(places, (socket.gethostname(), settings.cache_capacity), group=everyone.cpu)
    topology = Topology.from_hosts([str(p[0]) for p in places if p is not None], rank)
    # Every rank must cycle alike: the smallest capacity any rank was given (0 on one rank turns the cache off)
    capacity = min(int(p[1]) for p in places if p is not None)
    coordinator = None
    address: List[Optional[str]] = [None]
    if rank == 0:
        listener = coordination.listen(single_host=topology.local_size == size)
        coordinator = coordination.Coordinator(listener, size, settings, broadcast=capacity > 0,
                                               on_event=timeline.record)
        coordinator.start()
        host, port = listener.getsockname()[:2]
        address = [f"{host}:{port}"]
    dist.broadcast_object_list(address, src=0, group=everyone.cpu)
    host, port = str(address[0]).rsplit(":", 1)
    channel = Channel(socket.create_connection((host, int(port)), timeout=settings.collective_timeout_s))
    channel.sock.settimeout(None)
    silence = coordination.HEARTBEAT_S * 60 if settings.stall_shutdown_s > 0 else 0.0
    core: EngineCore = EngineCore(RankCycle(max(capacity, 0), settings.stall_check_s, settings.fusion_threshold), size,
                                  settings.cycle_time_s)
    dispatcher = Dispatcher(_set_communicator, _on_set, lambda: STATE.join_device, on_event=timeline.record)
    engine = Engine(channel, rank, core, dispatcher, partial(agree, everyone), silence, on_closed=_on_closed)
    world = World(topology, settings, everyone, engine, coordinator, {tuple(range(size)): everyone})
    engine.start()
    atexit.register(_at_exit)
    return world


def _on_closed(gen: int) -> None:
    """A generation was shut down (reader thread). This rank's, while it is in it: its next init() starts the next
    one, as the ranks that shut it down do. One it has not reached yet (another rank is a generation ahead) stays its
    own to enter, and to shut down."""
    if STATE.initialized and gen == STATE.gen:
        STATE.ended_elsewhere = True


def _set_communicator(ps: int) -> Communicator:
    """The groups of process set `ps` (engine thread)."""
    world = STATE.world
    assert world is not None
    if ps == 0:
        return world.everyone
    return STATE.sets[ps]


def _on_set(response: Response) -> None:
    """A process set added or removed on every rank (engine thread: group creation is collective)."""
    world = STATE.world
    assert world is not None
    if response.kind == ADD_SET:
        if response.set_id < 0:
            return
        key = tuple(response.ranks)
        if key not in world.groups:
            world.groups[key] = _communicator(list(key), world.topology.rank, world.settings)
        if response.gen == STATE.gen:
            STATE.sets[response.set_id] = world.groups[key]
    elif response.gen == STATE.gen:
        STATE.sets.pop(response.set_id, None)


def init(comm: Optional[object] = None) -> bool:
    """Join the job (the first time), then start a generation of collectives with only the global process set;
    whether one started (False: this rank is initialized already). `comm` may be omitted or list every rank."""
    if is_initialized():
        return False
    if STATE.initialized:  # another rank's shutdown() ended this generation: this rank's ends too
        _end_generation()
    if comm is not None and not isinstance(comm, (list, tuple, range)):
        raise ValueError("hvd.init(comm=...) with an MPI communicator is not offered by the Horovod API on "
                         "torch.distributed: call hvd.init() on every rank (use process sets for subsets of ranks)")
    settings = _read_settings()
    if STATE.world is None:
        STATE.world = _build_world(settings)
    else:
        STATE.gen += 1
    world = STATE.world
    ranks = list(comm) if isinstance(comm, (list, tuple, range)) else []
    if ranks and sorted(ranks) != list(range(world.topology.size)):
        raise ValueError(f"hvd.init(comm={ranks}) on a subset of the ranks is not offered by the Horovod API on "
                         "torch.distributed: call hvd.init() on every rank and use hvd.add_process_set for the subset")
    STATE.handles.reset()
    STATE.settings = settings
    STATE.sets = {0: world.everyone}
    STATE.join_device = -1
    STATE.ended_elsewhere = False
    STATE.initialized = True
    _export(world.topology)
    return True


def shutdown() -> None:
    """hvd.shutdown(): end this generation's collectives on every rank; what still waits fails with Horovod's
    shutdown error."""
    if not STATE.initialized:
        return
    world = STATE.world
    assert world is not None
    timeline.stop()  # rank 0 writes it now, while the process still runs
    world.engine.send({"type": "leave", "gen": STATE.gen})
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    while not world.engine.finished(STATE.gen) and world.engine.broken is None and time.monotonic() < deadline:
        time.sleep(0.01)
    _end_generation()


def _end_generation() -> None:
    STATE.initialized = False
    STATE.sets = {}


def _at_exit() -> None:
    """The process ends: finish this rank's collectives in flight, then tell the coordinator this rank is gone."""
    world = STATE.world
    if world is None:
        return
    try:
        shutdown()
    finally:
        world.engine.send({"type": "bye"})


def generation() -> int:
    """The number of this rank's generation of collectives (each hvd.init() after a shutdown starts the next)."""
    return STATE.gen


def cycle_counts() -> Counts:
    """What this rank's engine cycles did since the job started (all zeros before the first init())."""
    return STATE.world.engine.counts() if STATE.world is not None else Counts()


def active() -> State:
    """The state of an initialized API; ValueError (Horovod's) before init()."""
    if not STATE.initialized or STATE.world is None:
        raise ValueError(NOT_INITIALIZED)
    return STATE


def members(set_id: Optional[int]) -> Optional[List[int]]:
    """The ranks of process set `set_id` if it exists in this generation, else None."""
    if not STATE.initialized or set_id is None:
        return None
    found = STATE.sets.get(set_id)
    return None if found is None else found.ranks


def this_rank() -> int:
    """This process's rank, whether initialized or not: -1 before the first init()."""
    return STATE.world.topology.rank if STATE.world is not None else -1


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """hvd.start_timeline(): rank 0 records the timeline into `file_path` (a running one stops first)."""
    active()
    timeline.stop()
    if rank() == 0:
        timeline.start(file_path, mark_cycles)


def stop_timeline() -> None:
    """hvd.stop_timeline(): stop recording and write the timeline."""
    active()
    timeline.stop()


def start_configured_timeline() -> None:
    """At hvd.init(): the timeline HOROVOD_TIMELINE names, unless one records (DYNAMIC only allows
    start_timeline)."""
    settings = active().settings
    if settings.timeline and settings.timeline.upper() != "DYNAMIC" and not timeline.running():
        start_timeline(settings.timeline, settings.timeline_mark_cycles)


def topology() -> Topology:
    """This process's place in the job (ValueError before init())."""
    world = active().world
    assert world is not None
    return world.topology


def is_initialized() -> bool:
    """Whether init() was called and no rank's shutdown() has ended it since."""
    return STATE.initialized and STATE.world is not None and not STATE.ended_elsewhere


def rank() -> int:
    """This process's rank in the job."""
    return topology().rank


def size() -> int:
    """The number of processes in the job."""
    return topology().size


def local_rank() -> int:
    """This process's rank among the job's processes on its host."""
    return topology().local_rank


def local_size() -> int:
    """The number of the job's processes on this host."""
    return topology().local_size


def cross_rank() -> int:
    """The rank of this host among the hosts with a process of this local rank."""
    return topology().cross_rank


def cross_size() -> int:
    """The number of hosts with a process of this local rank."""
    return topology().cross_size


def is_homogeneous() -> bool:
    """Whether every host runs the same number of processes."""
    return topology().homogeneous

