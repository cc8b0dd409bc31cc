"""`horovod.ray.RayExecutor` on Ray actors that hold one torch.distributed group (horovod/ray/runner.py's
StaticAdapter is what it keeps the meaning of).

Actors, not Ray Train: Horovod's executor is a set of long-lived workers that the driver calls again and again
(`run`, `execute`, `execute_single`, `run_remote`), each call seeing what the last one left in the workers (a model,
an optimizer, the executable's attributes). An actor keeps its process, so the workers keep their state and their
process group; Ray Train's TorchTrainer runs one training function to its end in workers it starts and ends itself,
so it keeps neither across calls.

- `start()` reserves the workers in a placement group (one bundle a worker, PACK; STRICT_SPREAD over `num_hosts`),
  refused in one line naming what it asks and what the cluster has if the group is not ready within
  `placement_group_timeout_s`; then each actor learns its rank, its host's local rank, and rank 0's address and port.
- The first `hvd.init()` a function calls joins the group; later calls find it.
- An exception in one worker is the exception of `run()`/`execute()` (outcomes.WorkerError naming the rank and its
  message). The other workers may be waiting in a collective for it, so every actor is ended with it: the executor is
  then shut down (`start()` again for a new one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import visible
from .outcomes import Outcome, RemoteError, in_rank_order
from .ray_worker import Worker

WHERE = "RayExecutor"
ELASTIC_REFUSED = ("RayExecutor(min_workers=..., max_workers=...) (elastic Horovod on Ray) is not offered by the "
                   "Horovod API on torch.distributed: pass num_workers=N (a fixed number of workers)")

log = logging.getLogger("horovod.ray")


@dataclass
class MiniSettings:
    """RayExecutor.create_settings()'s settings (Horovod's MiniSettings): `placement_group_timeout_s` bounds the wait
    for the workers' resources, `timeout_s` the wait for the started actors to answer. `nics`, the ssh fields and
    `key` are kept for scripts that set them; the group's traffic goes where torch.distributed sends it."""

    nics: Optional[Set[str]] = None
    verbose: int = 1
    key: Optional[str] = None
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100
    elastic: bool = False


@dataclass(frozen=True)
class Place:
    """Where one worker runs: its node's address and host name."""

    address: str
    hostname: str


def local_ranks(places: List[Place]) -> List[Tuple[int, int]]:
    """Each rank's (local rank, local size) among the ranks on its node, in rank order."""
    on_node: Dict[str, List[int]] = {}
    for rank, place in enumerate(places):
        on_node.setdefault(place.address, []).append(rank)
    return [(on_node[p.address].index(r), len(on_node[p.address])) for r, p in enumerate(places)]


def rank_env(places: List[Place], master_port: int) -> List[Dict[str, str]]:
    """The variables of every rank: its rank and local rank, and rank 0's store (torch.distributed's rendezvous)."""
    hosts = list(dict.fromkeys(p.address for p in places))
    envs = []
    for rank, (local_rank, local_size) in enumerate(local_ranks(places)):
        envs.append({"RANK": str(rank), "WORLD_SIZE": str(len(places)), "LOCAL_RANK": str(local_rank),
                     "LOCAL_WORLD_SIZE": str(local_size), "GROUP_RANK": str(hosts.index(places[rank].address)),
                     "GROUP_WORLD_SIZE": str(len(hosts)), "MASTER_ADDR": places[0].address,
                     "MASTER_PORT": str(master_port)})
    return envs


class RayExecutor:
    """Horovod's RayExecutor: `num_workers` Ray actors (or `num_hosts` x `num_workers_per_host`) that each run the
    functions they are given on the API, as one job."""

    @classmethod
    def create_settings(cls, timeout_s: int = 30, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: int = 100,
                        nics: Optional[Set[str]] = None) -> MiniSettings:
        """Horovod's settings for an executor (`ssh_*` and `nics` have no effect here)."""
        return MiniSettings(nics=nics, timeout_s=timeout_s, ssh_identity_file=ssh_identity_file,
                            placement_group_timeout_s=placement_group_timeout_s)

    def __init__(self, settings: Optional[MiniSettings] = None, num_workers: Optional[int] = None,
                 num_hosts: Optional[int] = None, num_workers_per_host: int = 1, cpus_per_worker: int = 1,
                 use_gpu: bool = False, gpus_per_worker: Optional[int] = None,
                 use_current_placement_group: bool = True, min_workers: Optional[int] = None,
                 max_workers: Optional[int] = None, reset_limit: Optional[int] = None,
                 cooldown_range: Optional[List[int]] = None, elastic_timeout: int = 600,
                 override_discovery: bool = True) -> None:
        if min_workers is not None or max_workers is not None:
            raise ValueError(ELASTIC_REFUSED)
        if (num_workers is None) == (num_hosts is None):
            raise ValueError(f"{WHERE}: pass num_workers=N, or num_hosts=H with num_workers_per_host=W (one of "
                             f"the two), not num_workers={num_workers!r} with num_hosts={num_hosts!r}")
        count = num_workers if num_workers is not None else (num_hosts or 0) * num_workers_per_host
        if count < 1 or cpus_per_worker < 0:
            raise ValueError(f"{WHERE}: {count} workers of {cpus_per_worker} CPUs each: pass num_workers >= 1 and "
                             "cpus_per_worker >= 0")
        self.settings = settings or MiniSettings()
        self.num_workers = count
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.workers: List[Any] = []
        self._group: Any = None

    # --- start and end ------------------------------------------------------------------------------------------

    def _bundles(self) -> Tuple[List[Dict[str, float]], str]:
        one = {"CPU": float(self.cpus_per_worker)}
        if self.gpus_per_worker:
            one["GPU"] = float(self.gpus_per_worker)
        if self.num_hosts is None:
            return [dict(one) for _ in range(self.num_workers)], "PACK"
        per_host = {k: v * self.num_workers_per_host for k, v in one.items()}
        return [dict(per_host) for _ in range(self.num_hosts)], "STRICT_SPREAD"

    def _reserve(self) -> Any:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        bundles, strategy = self._bundles()
        group = placement_group(bundles, strategy=strategy)
        timeout_s = self.settings.placement_group_timeout_s
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(group)
            wanted = {k: sum(b.get(k, 0.0) for b in bundles) for k in bundles[0]}
            have = ray.cluster_resources()
            asked = ", ".join(f"{v:g} {k}" for k, v in wanted.items())
            owned = ", ".join(f"{have.get(k, 0.0):g} {k}" for k in wanted)
            raise TimeoutError(f"{WHERE}: {self.num_workers} workers need {asked}, the Ray cluster has {owned} "
                               f"(not placed within placement_group_timeout_s={timeout_s:g} s): lower num_workers "
                               "or cpus_per_worker, or add nodes")
        return group

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[List[Any]] = None,
              executable_kwargs: Optional[Dict[str, Any]] = None,
              extra_env_vars: Optional[Dict[str, str]] = None) -> None:
        """Start the workers: reserve their resources, start one actor each, tell each its rank and rank 0's address,
        and make `executable_cls(*executable_args, **executable_kwargs)` in each (the object `execute` hands fn)."""
        import ray

        if self.workers:
            raise RuntimeError(f"{WHERE}: start() was called already: call shutdown() first for new workers")
        if not ray.is_initialized():
            ray.init()
        self._group = self._reserve()
        try:
            with visible.shown():
                self._start_workers(executable_cls, executable_args, executable_kwargs, extra_env_vars)
        except BaseException:
            self.shutdown()
            raise

    def _start_workers(self, executable_cls: Optional[type], executable_args: Optional[List[Any]],
                       executable_kwargs: Optional[Dict[str, Any]], extra_env_vars: Optional[Dict[str, str]]) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(Worker)
        for rank in range(self.num_workers):
            bundle = rank if self.num_hosts is None else rank // self.num_workers_per_host
            strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=bundle)
            self.workers.append(remote.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                                               scheduling_strategy=strategy).remote())
        timeout_s = self.settings.timeout_s
        places = [Place(*p) for p in ray.get([w.where.remote() for w in self.workers], timeout=timeout_s)]
        port = ray.get(self.workers[0].free_port.remote(), timeout=timeout_s)
        extra = {str(k): str(v) for k, v in (extra_env_vars or {}).items()}
        ray.get([w.update_env_vars.remote({**extra, **env})
                 for w, env in zip(self.workers, rank_env(places, port), strict=True)], timeout=timeout_s)
        self._gather([w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                      for w in self.workers])

    def shutdown(self) -> None:
        """End every worker (its process, and the group with it) and free their resources."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for worker in self.workers:
            try:
                ray.kill(worker)
            except Exception:  # already gone
                pass
        self.workers = []
        if self._group is not None:
            try:
                remove_placement_group(self._group)
            except Exception:
                pass
            self._group = None

    # --- calls --------------------------------------------------------------------------------------------------

    def _running(self) -> List[Any]:
        if not self.workers:
            raise RuntimeError(f"{WHERE}: no workers: call start() first (after a worker failed, the executor was "
                               "shut down: start() again)")
        return self.workers

    def _gather(self, refs: List[Any]) -> List[Any]:
        """The results of one call on every worker, in rank order; the first worker's failure ends every worker and is
        raised naming its rank."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        outcomes: Dict[int, Outcome] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            rank = rank_of[ready[0]]
            try:
                outcomes[rank] = Outcome(rank, value=ray.get(ready[0]))
            except RayTaskError as exc:
                cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                error = RemoteError(rank, type(cause).__name__, str(cause), str(exc))
                outcomes[rank] = Outcome(rank, error=error)
            except RayActorError as exc:
                outcomes[rank] = Outcome(rank, error=RemoteError(rank, "WorkerDied", str(exc).splitlines()[0]))
            if outcomes[rank].error is not None:
                self.shutdown()  # the others may wait for it in a collective: they end with it
                break
        return in_rank_order(WHERE, outcomes, len(refs))

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable[..., Any]]] = None) -> List[Any]:
        """fn(executable) on every worker; the results in rank order."""
        with visible.shown():
            refs = [w.execute.remote(fn) for w in self._running()]
        return self._gather(refs)

    def run(self, fn: Callable[..., Any], args: Optional[List[Any]] = None, kwargs: Optional[Dict[str, Any]] = None,
            callbacks: Optional[List[Callable[..., Any]]] = None) -> List[Any]:
        """fn(*args, **kwargs) on every worker; the results in rank order."""
        return self._gather(self.run_remote(fn, args, kwargs))

    def run_remote(self, fn: Callable[..., Any], args: Optional[List[Any]] = None,
                   kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
        """fn(*args, **kwargs) started on every worker: their ObjectRefs in rank order (for ray.get)."""
        with visible.shown():
            return [w.call.remote(fn, list(args or []), dict(kwargs or {})) for w in self._running()]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable) on rank 0's worker only; its result."""
        with visible.shown():
            ref = self._running()[0].execute.remote(fn)
        return self._gather([ref])[0]
