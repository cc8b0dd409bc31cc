"""Horovod elastic: the job goes on when workers leave or join (horovodrun --min-np/--max-np
--host-discovery-script).

The committed state is the checkpoint state of the shared loop, kept in memory on every rank at each
checkpoint (every --checkpoint-every steps and at every epoch end). After a failure or a change of
members, `hvd.elastic.run` re-initialises Horovod and runs the training function again; its first act
(rejoin) brings every rank, new ones included, to one committed state:

- the same world size: the newest commit, so a replaced worker costs only the steps since then;
- another world size: the newest commit made at an epoch boundary, because the sample order of an
  epoch depends on the world size (the same rule as resuming from a checkpoint file); under
  --reduction exact nothing depends on the world size, so the newest commit again.
"""

from __future__ import annotations

import copy
from typing import Optional

from common.checkpoints.format import CheckpointError
from common.config import is_exact

from .backend import broadcast_state


def make_state(hvd):
    """A horovod.common.elastic.State that holds the loop's committed checkpoint states."""
    from horovod.common.elastic import State

    class CommittedState(State):
        def __init__(self) -> None:
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)
            self.latest: Optional[dict] = None       # the newest commit
            self.epoch_start: Optional[dict] = None  # the newest commit made at an epoch boundary

        def keep(self, state: dict) -> None:
            """Commit `state`; Horovod then checks for new or lost hosts (it may interrupt here)."""
            kept = copy.deepcopy(state)  # on CPU, state_dict tensors are the live weights
            self.latest = kept
            if kept["batch"] == 0:
                self.epoch_start = kept
            self.commit()

        def choose(self, world_size: int) -> Optional[dict]:
            """The commit a job of `world_size` ranks can continue from exactly."""
            latest = self.latest
            if latest is None:
                return None
            if is_exact(latest["settings"]) or latest["world_size"] == world_size or latest["batch"] == 0:
                return latest
            return self.epoch_start

        # Horovod calls these around a reset; the work is done in rejoin(), inside the training function,
        # so that ranks that were there and ranks that just joined run the same collectives in order.
        def save(self) -> None:
            pass

        def restore(self) -> None:
            pass

        def sync(self) -> None:
            pass

    return CommittedState()


def fit_elastic(trainer) -> int:
    """Trainer.fit under hvd.elastic.run: every checkpoint is also committed on every rank, and after the
    job's members change every rank continues from one commit (rejoin) and fits again."""
    hvd = trainer.backend.hvd
    committed = make_state(hvd)
    trainer.checkpointer.on_save.append(committed.keep)

    @hvd.elastic.run
    def elastic_fit(state):
        rejoin(hvd, state, trainer)
        return trainer.fit()

    return elastic_fit(committed)


def rejoin(hvd, state, trainer) -> None:
    """Bring every rank to one committed state. Collective; the first thing each (re)start does."""
    trainer.stop.start_liveness()  # the members and their ranks may have changed
    steps = hvd.allgather_object(state.latest["step"] if state.latest is not None else -1)
    newest = max(steps)
    if newest < 0:
        # The job starts: every rank built the same model and position; rank 0's weights win, as in wrap().
        broadcast_state(trainer.backend.waiter, trainer.plain_model.state_dict())
        state.keep(trainer.state_dict())
        return
    root = steps.index(newest)
    chosen = state.choose(hvd.size()) if hvd.rank() == root else None
    chosen = hvd.broadcast_object(chosen, root_rank=root)
    if chosen is None:
        raise CheckpointError(
            f"elastic: the world size changed to {hvd.size()} in the middle of an epoch before any epoch-end "
            "state was committed; restart with --resume auto")
    where = "epoch end" if chosen["batch"] == 0 else "mid-epoch"
    origin = f"the elastic commit at step {chosen['step']} ({where})"
    trainer.load_state_dict(chosen, origin=origin)
    trainer.note(f"elastic: {hvd.size()} ranks continue from {origin}")
