"""One rank's probe from the script's first line to its exit: the hooks, the records, the checks of what the
probe can follow, and, on rank 0, the run directory when every rank has ended."""

from __future__ import annotations

import os
import socket
import time
from typing import Callable, List, NoReturn, Optional

import torch

from common.checkpoints.format import file_sha256
from common.inputs.perturb import GradientDisturbance, gradient_disturbance, perturb_ulp
from common.launch.openmpi import MPI_YIELD_VARIABLE, yield_mpi_when_idle
from common.launch import userscript
from common.launch.placement import Placement, cores
from common.rundir.fingerprint import tensor_norms

from . import assemble
from .hooks import Hooks, distributed_world, gradient_precision, reduced_bytes, unwrap
from .recorder import Recorder

#: how long rank 0 waits, once its script has ended, for the other ranks' records to end
WAIT_S = 120.0


class Session:
    """The probe on one rank."""

    def __init__(self, run_dir: str, script: str, argv: List[str], placement: Placement, perturb: int,
                 pattern: int, refuse: Callable[[str], NoReturn], max_steps: Optional[int] = None) -> None:
        self.run_dir, self.script, self.argv, self.placement = run_dir, script, argv, placement
        self.perturb, self.pattern, self.refuse, self.max_steps = perturb, pattern, refuse, max_steps
        self.disturbance: Optional[GradientDisturbance] = None
        self.recorder = Recorder(run_dir, placement.rank)
        self.hooks = Hooks(self.recorder, self._refuse, self._started, self._check_world, self._reduced,
                           self._stepped)
        self.failed = False

    def start(self) -> None:
        """Install the hooks and write this rank's first record, before the script runs."""
        self.hooks.install()
        # Open MPI yields the core while it waits, as under hvd_train: a busy-polling rank takes a core from the
        # compute of a script on CPU, and its speed would measure that, not the backend.
        yielding = yield_mpi_when_idle(not torch.cuda.is_available(), "the probe: ranks on CPU")
        self.recorder.write("probe", rank=self.placement.rank, world_size=self.placement.world_size,
                            host=socket.gethostname(), launcher=self.placement.launcher, script=self.script,
                            argv=self.argv, sha256=file_sha256(self.script), cwd=os.getcwd(),
                            perturb_ulp=self.perturb, perturb_pattern=self.pattern, max_steps=self.max_steps,
                            cores=cores(),
                            ranks_per_host=self.placement.local_world_size,
                            mpi_yield_when_idle=os.environ.get(MPI_YIELD_VARIABLE), mpi_yield_source=yielding)

    def _refuse(self, message: str) -> NoReturn:
        self.recorder.write("refused", message=message)
        self.refuse(f"{self.script}: {message}")

    def _started(self, model: torch.nn.Module) -> None:
        """The model's first training forward: disturb it when asked, then record the weights it starts from."""
        plain = unwrap(model)
        built = tensor_norms(list(model.parameters()))
        if self.perturb:
            perturb_ulp(plain, self.perturb, self.pattern)
        names = [name for name, _ in plain.named_parameters()]
        self.recorder.write("start", model=type(plain).__name__, parameters=names,
                            buffers=[name for name, _ in plain.named_buffers()], built=built,
                            wnorm=tensor_norms(list(model.parameters())), threads=torch.get_num_threads(),
                            device=str(next(model.parameters()).device))

    def _reduced(self, optimizer: torch.optim.Optimizer, params: List[torch.Tensor]) -> None:
        """The reduced gradients a training step is about to apply: at the first, the precision they were rounded
        at (recorded); in a disturbed run whose gradients are rounded below float32, each moved one unit of it."""
        if self.recorder.steps == 0:
            found, how = gradient_precision(optimizer, self.hooks.wrapper, params)
            self.recorder.write("precision", gradients=found, how=how)
            self.recorder.write("reduced", bytes=reduced_bytes(params, found, how))
            self.disturbance = gradient_disturbance(self.perturb, self.pattern, found)
        if self.disturbance is not None:
            self.disturbance(params, self.recorder.steps + 1)

    def _stepped(self, steps: int) -> None:
        """After each training step: with --max-steps, the script ends at that step on every rank, as if it
        returned there (its atexit handlers run, then the probe's finish writes the run directory)."""
        if self.max_steps is None or steps < self.max_steps:
            return
        if self.placement.rank == 0:
            print(f"probe: {self.script} stopped after step {steps} (--max-steps {self.max_steps})", flush=True)
        userscript.leave(0)

    def _check_world(self) -> None:
        """At the first training step: the script must train in the launcher's job, not alone on each rank."""
        joined = distributed_world()
        self.recorder.write("world", **joined)
        if self.placement.world_size > 1 and joined["size"] != self.placement.world_size:
            self.refuse(f"{self.script}: the launcher started {self.placement.world_size} ranks but the script "
                        f"trains in a job of {joined['size']} (it initialised "
                        f"{'no process group' if joined['name'] == 'local' else joined['name']}); it must join the "
                        "launcher's job: torch.distributed.init_process_group() under torchrun, hvd.init() under "
                        "horovodrun")

    def finish(self) -> None:
        """At exit: end this rank's record; rank 0 saves the model, waits for every rank's record to end and
        writes the run directory."""
        if self.recorder.steps == 0 and not self.failed:
            self._refuse("made no optimizer step the probe could follow (it follows the step() of torch.optim "
                         "optimizers after a backward())")
        status = "failed" if self.failed else "ok"
        self.recorder.write("end", steps=self.recorder.steps, status=status)
        self.recorder.close()
        model, self.hooks.model = self.hooks.model, None
        if self.placement.rank != 0 or self.failed:
            return
        assert model is not None, "a step the probe followed came after the model's first training forward"
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        if not assemble.wait_for_ranks(self.run_dir, self.placement.world_size, time.monotonic() + WAIT_S):
            self.refuse(f"{self.script}: a rank's record did not end within {WAIT_S:.0f} s of rank 0's; see its "
                        "output above")
        assemble.write(self.run_dir, self.placement.world_size, state)
