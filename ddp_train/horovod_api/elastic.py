"""Horovod elastic (`hvd.elastic.run`, `TorchState`, `ObjectState`, `ElasticSampler`) on torchrun's restarts.

Horovod's elastic driver keeps the surviving processes, re-forms the job and rolls their state back to the last
commit. Under torchrun a lost process makes torchrun stop every process and start them all again (--max-restarts,
and --nnodes MIN:MAX for hosts that come and go). So here: a collective that fails inside `hvd.elastic.run` (a rank
died) makes each surviving process write the state of its last `state.commit()` to this host's temporary folder
(keyed by torchrun's run id) and exit; when torchrun starts the job again, `hvd.elastic.run` loads the newest such
commit on any host, broadcasts it from there, and the function continues from it. Between restarts nothing lives in
memory: a commit is in memory only (cheap, as in Horovod) until a failure writes it.

Outside torchrun (mpirun, srun, a lone process) `hvd.elastic.run` runs the function once: a failure ends the job.
"""

from __future__ import annotations

import copy
import functools
import getpass
import glob
import io
import math
import os
import random
import signal
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import cloudpickle
import torch

from . import runtime
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters

PROG = "horovod_api"


class State:
    """What survives a failure: save() on commit(), restore() after one, sync() from rank 0 at the start."""

    def __init__(self, bcast_object: Callable[..., Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: List[Callable[[], None]] = []
        self._commits = 0

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: Any) -> None:
        """Horovod's driver calls this; under torchrun a change of hosts restarts the processes instead."""

    def commit(self) -> None:
        """Keep the current state as the one a restart continues from."""
        self.save()
        self._commits += 1
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Hosts never change under a running job here (torchrun restarts it): nothing to do."""

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self, root_rank: int = 0) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        pass

    # --- surviving a restart ---------------------------------------------------------------------------------
    def _snapshot(self) -> Dict[str, Any]:
        """The last commit, as plain data."""
        raise NotImplementedError()

    def _load_snapshot(self, snapshot: Dict[str, Any]) -> None:
        raise NotImplementedError()


class ObjectState(State):
    """Plain attributes (epoch=..., batch=...) kept as they were at the last commit."""

    def __init__(self, bcast_object: Callable[..., Any], get_rank: Callable[[], int], **kwargs: Any) -> None:
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self, root_rank: int = 0) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, root_rank)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)

    def _snapshot(self) -> Dict[str, Any]:
        return {"objects": cloudpickle.dumps(self._saved_state), "commits": self._commits}

    def _load_snapshot(self, snapshot: Dict[str, Any]) -> None:
        self._saved_state = cloudpickle.loads(snapshot["objects"])
        self._commits = snapshot["commits"]
        self._set_attrs()


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: a shuffled partition of the dataset over the ranks that skips the samples already
    processed this epoch (record_batch), so that a restart continues the epoch where its last commit was."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: List[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict: Dict[str, int]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def reset(self) -> None:
        self.num_replicas = runtime.size()
        self.rank = runtime.rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = self.remaining_indices[:]
        indices += indices[:self.total_size - len(indices)]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class _Handler:
    """How one kind of object in a TorchState is saved, restored and synchronized."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.saved = copy.deepcopy(self.value.state_dict())

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()

    def sync(self, root_rank: int) -> None:
        raise NotImplementedError()


class _ModelHandler(_Handler):
    def sync(self, root_rank: int) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=root_rank)


class _OptimizerHandler(_Handler):
    def sync(self, root_rank: int) -> None:
        broadcast_optimizer_state(self.value, root_rank=root_rank)


class _SamplerHandler(_Handler):
    def sync(self, root_rank: int) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank))


_HANDLERS: List[Tuple[type, type]] = [(torch.nn.Module, _ModelHandler), (torch.optim.Optimizer, _OptimizerHandler),
                                      (ElasticSampler, _SamplerHandler)]


class TorchState(ObjectState):
    """A model, an optimizer, samplers and plain attributes, committed and restored together."""

    def __init__(self, model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None,
                 **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: Dict[str, _Handler] = {}
        rest: Dict[str, Any] = {}
        for key, value in kwargs.items():
            kind = next((h for t, h in _HANDLERS if isinstance(value, t)), None)
            if kind is not None:
                handlers[key] = kind(value)
            else:
                rest[key] = value
        self._handlers = handlers
        for key, handler in handlers.items():
            setattr(self, key, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=runtime.rank, **rest)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self, root_rank: int = 0) -> None:
        for handler in self._handlers.values():
            handler.sync(root_rank)
        super().sync(root_rank)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers and name in handlers and hasattr(self, name):
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def _snapshot(self) -> Dict[str, Any]:
        snapshot = super()._snapshot()
        snapshot["handlers"] = {key: handler.saved for key, handler in self._handlers.items()}
        return snapshot

    def _load_snapshot(self, snapshot: Dict[str, Any]) -> None:
        super()._load_snapshot(snapshot)
        for key, saved in snapshot["handlers"].items():
            if key in self._handlers:
                self._handlers[key].saved = saved
                self._handlers[key].restore()


# --- across torchrun's restarts ---------------------------------------------------------------------------------
def _folder() -> Optional[str]:
    """This host's folder of commits for torchrun's job (None outside torchrun): its run id and the agent that
    restarts the processes on this host (their parent, the same across restarts; one-host rendezvous share the run
    id "none")."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    return os.path.join(tempfile.gettempdir(), f"horovod_api-elastic-{getpass.getuser()}-{safe}-{os.getppid()}")


def _write_commit(state: State) -> None:
    folder = _folder()
    if folder is None or state._commits == 0:
        return
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"commit-rank{max(runtime.this_rank(), 0)}.pt")
    buffer = io.BytesIO()
    torch.save(state._snapshot(), buffer)
    with open(path + ".tmp", "wb") as out:
        out.write(buffer.getvalue())
    os.replace(path + ".tmp", path)


def _newest_commit() -> Tuple[int, Optional[str]]:
    """(commits, path) of the newest commit written on this host for this run; (-1, None) without one."""
    folder = _folder()
    best: Tuple[int, Optional[str]] = (-1, None)
    for path in glob.glob(os.path.join(folder, "commit-rank*.pt")) if folder else []:
        try:
            commits = int(torch.load(path, weights_only=False)["commits"])
        except Exception:  # a partial or foreign file: not a commit
            continue
        if commits > best[0]:
            best = (commits, path)
    return best


def _resume(state: State) -> None:
    """After torchrun restarted the job: continue from the newest commit a survivor wrote, on whichever host."""
    commits, path = _newest_commit()
    found = allgather_object(commits, name="horovod_api.elastic.commits")
    newest = max(found)
    if newest < 0:
        state.sync()
        return
    root = found.index(newest)
    if runtime.rank() == root and path is not None:
        state._load_snapshot(torch.load(path, weights_only=False))
        sys.stderr.write(f"[rank {runtime.rank()}] {PROG}: continuing from commit {newest} of the previous attempt\n")
    state.sync(root)


class _Stopped(BaseException):
    """torchrun stops the survivors of a failure with SIGTERM: caught to write the last commit first."""


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """hvd.elastic.run: call `func(state, ...)` with the state synchronized from rank 0 (or, after torchrun restarted
    the job, from the newest commit a surviving process wrote). When a collective fails (a rank died), this process
    writes its last commit and exits, and torchrun (--max-restarts) starts the job again."""
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        under_torchrun = _folder() is not None

        def stopped(signum: int, frame: Any) -> None:
            raise _Stopped()

        previous = signal.signal(signal.SIGTERM, stopped) if under_torchrun else None
        try:
            if under_torchrun:
                _resume(state)
            else:
                state.sync()
            result = func(state, *args, **kwargs)
        except (HorovodInternalError, HostsUpdatedInterrupt, _Stopped) as exc:
            if not under_torchrun:
                raise
            _write_commit(state)
            left = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) - int(
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
            sys.stderr.write(f"[rank {runtime.rank()}] {PROG}: the job lost a rank ({type(exc).__name__}); this "
                             f"process wrote its last commit and exits for torchrun to restart the job"
                             f"{'' if left > 0 else ' (no restarts left: launch with torchrun --max-restarts N)'}\n")
            sys.stderr.flush()
            os._exit(1)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        _clean_commits()
        return result

    return wrapper


def _clean_commits() -> None:
    """The function returned: this run's commits on this host are of no further use."""
    folder = _folder()
    if folder is None:
        return
    for path in glob.glob(os.path.join(folder, "commit-rank*.pt")):
        try:
            os.remove(path)
        except OSError:
            pass
