"""The exceptions Horovod's API raises, and the texts of its errors, as Horovod words them (so that a script's
`except` clauses and a user's search for a message find the same thing)."""

from __future__ import annotations


class HorovodInternalError(RuntimeError):
    """A collective failed: mismatched tensors across ranks, a rank that stopped taking part or exited, or the API
    shut down. Raised by `synchronize()` (and the synchronous collectives) on every rank the collective involved."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic's signal that the job's hosts changed (kept for scripts that catch it; the API never raises
    it: under torchrun a change of members restarts the processes)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
SHUT_DOWN = ("Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
             "allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown "
             "was caused by an exception, you should see the exception in the log before the first shutdown message.")
DUPLICATE_NAME = ("Requested to allreduce, allgather, or broadcast a tensor with the same name as another tensor that "
                  "is currently being processed.  If you want to request another tensor, use a different tensor "
                  "name.")
DYNAMIC_PROCESS_SETS = "Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets after Horovod initialization."
DYNAMIC_PROCESS_SETS_REMOVE = ("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets after Horovod "
                               "initialization.")
NOT_A_MEMBER = "Process is not part of provided process set."
UNKNOWN_SET = "Process set does not exist or has not been registered."
#: hvd.Adasum is refused before any request is made (no rank ever asks the others for an Adasum)
ADASUM_REFUSED = ("op=hvd.Adasum is not offered by the Horovod API on torch.distributed: use op=hvd.Average (the "
                  "default) or op=hvd.Sum, and scale the learning rate by hvd.size() as for Average")
