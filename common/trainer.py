"""THE training loop. Both backends run exactly this code; they differ only behind the Backend seam."""

from __future__ import annotations

import os
import signal
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch._dynamo  # torch.optim imports it with the first optimizer; here it comes in with the
# other imports of a rank's start-up, while the garbage collector sleeps (common.entry, common.launch.startup)

from common.checkpoints import format as ckpt_io
from common.checkpoints.during_run import Checkpointer, run_settings
from common.config import AMP_FP16_NEEDS_CUDA, Config
from common.errors import UsageError, fail_usage, print_error
from common.exact.step import ExactStep
from common.faults import sigterm_hold
from common.faults.stopping import Interrupted, StopControl
from common.inputs.models import gradient_bytes
from common.inputs.opening import Inputs, open_inputs
from common.inputs.perturb import gradient_disturbance
from common.rundir.names import CONFIG_FILE, MODEL_FILE, SUMMARY_FILE
from common.rundir.records import RunOutcome, RunSetup, config_record, summary_record
from common.rundir.writer import RunDir
from common.loop.backend import Backend, Tuning
from common.loop.batches import Batches
from common.loop.evaluation import evaluate
from common.rundir.fingerprint import weight_norms
from common.loop.finite import LossWatch, NonFinite, check_weights
from common.loop.optim import lr_at, make_optimizer, set_lr
from common.loop.position import Position, epoch_means
from common.loop.precision import Precision, set_numerics
from common.loop.profiling import PROFILE_DIR, StepProfiler
from common.loop.progress import done_line, epoch_bar, epoch_line
from common.loop.stepping import AllreduceStep, Step
from common.loop.steptimer import StepTimer


class Trainer:
    """One run: data, model and optimizer on a backend, the epoch loop, checkpoints, the run directory.

    Its parts: `inputs` (data and model, opened before any collective), `batches` (loaders, step counts,
    batches on the device), `step` (one optimizer step), `position` (where training stands), `checkpointer`
    (when a checkpoint is due, what it holds, resume), `stop` (signals, agreement, watchdog, how a rank
    leaves), `timer` (time split and throughput), `run_dir` (the files of the run). `state_dict()` /
    `load_state_dict()` are where training stands, as a checkpoint holds it.
    """

    def __init__(self, config: Config, backend: Backend, prog: str) -> None:
        self.config, self.backend, self.prog = config, backend, prog
        self.stop = StopControl(backend, config.timeout, prog)
        self.run_dir: Optional[RunDir] = None  # opened by fit()
        self.threads = 0
        # What prepare() opens and checks before any collective (declared here, set there):
        self.inputs: Inputs
        # The parts setup() builds on the joined job, and where training stands:
        self.model: torch.nn.Module  # the model training runs (wrapped by the backend)
        self.batches: Batches
        self.precision: Precision
        self.plain_model: torch.nn.Module  # the model's own module, unwrapped
        self.optimizer: torch.optim.Optimizer
        self.step: Step
        self.timer: StepTimer
        self.loss_watch: LossWatch
        self.profiler: StepProfiler
        self.checkpointer: Checkpointer
        self.position: Position

    # --- the program -------------------------------------------------------------------------------
    def run(self, fit: Optional[Callable[["Trainer"], int]] = None) -> int:
        """Check inputs, join the job, train (with `fit`, default Trainer.fit) and write the run
        directory. Returns the process exit code."""
        self.prepare()
        try:
            self.setup()
            return fit(self) if fit is not None else self.fit()
        except (ckpt_io.CheckpointError, UsageError) as exc:
            fail_usage(self.prog, str(exc))
        except NonFinite as exc:
            print_error(self.prog, str(exc), self.backend.rank)
            return 1
        except Interrupted as stop:
            self.say(f"stopped by {signal.Signals(stop.signum).name} at step {stop.step}; checkpoint written, "
                     "continue with --resume auto")
            self.stop.leave_stopped(stop.signum, close=self.close_run_dir)
        except Exception:  # any other failure ends this rank, loudly and at once
            self.stop.leave_failed()
        finally:
            self.stop.close()
            self.close_run_dir()
            self.stop.close_liveness()
            self.backend.shutdown()

    def prepare(self) -> None:
        """Open the data and check the model, run dir and device on every rank before any collective,
        then join the job. Bad input ends every rank here with one line and exit code 2."""
        config, backend = self.config, self.backend
        try:
            backend.check_environment()
            # The thread count first: the user's model and data are built with the threads the run computes
            # with (horovodrun and mpirun export no OMP_NUM_THREADS, so torch would take every core in
            # every rank); the launcher's local world size is known before init.
            self.threads = set_numerics(config, backend.local_world_size)
            # Built before init: the backend may tune itself to the model's size (Horovod's cycle time).
            self.inputs = open_inputs(config)
            backend.select_device(config.device)
        except (UsageError, ValueError, RuntimeError) as exc:
            fail_usage(self.prog, str(exc))
        if backend.rank == 0:
            problem = RunDir.check_writable(config.run_dir)
            if problem:
                fail_usage(self.prog, problem + "; choose another --run-dir")
        if config.resume is not None and config.resume != "auto" and not os.path.isfile(config.resume):
            fail_usage(self.prog, f"--resume {config.resume!r}: no such file; pass a checkpoint file or 'auto'")
        if config.amp == "fp16" and backend.device.type != "cuda":
            fail_usage(self.prog, AMP_FP16_NEEDS_CUDA)
        sigterm_hold.release()  # the input is good: a launcher's SIGTERM stops this rank from now on
        backend.configure(Tuning(config, gradient_bytes(self.inputs.model)))
        try:
            backend.init(config.timeout)
        except UsageError as exc:  # e.g. the rendezvous port is taken
            fail_usage(self.prog, str(exc))
        self.stop.start_liveness()
        self.stop.start()

    def setup(self) -> None:
        """Loaders, the model on its device, the optimizer wrapped by the backend, and the position to
        start from (a checkpoint's, or the beginning)."""
        config, backend = self.config, self.backend
        print(f"[{backend.name}] rank {backend.rank}/{backend.world_size} local_rank "
              f"{backend.local_rank}/{backend.local_world_size} host {backend.host()} device {backend.device} "
              f"threads {self.threads}", flush=True)
        self.batches = Batches(config, self.inputs.train_set, self.inputs.val_set, backend, backend.device)
        self.precision = Precision(config.amp, backend.device)
        # torch's stubs give Module.to no (device, memory_format) overload; torch takes it (one call, one copy).
        model = self.inputs.model.to(backend.device, memory_format=torch.channels_last  # type: ignore[call-overload]
                                     if config.channels_last else torch.preserve_format)
        optimizer = make_optimizer(config, model.parameters())
        if config.exact:  # the step sums gradients itself; rank 0's weights everywhere to start
            backend.broadcast_module(model)
            self.model, self.optimizer, self.plain_model = model, optimizer, model
            self.step = ExactStep(model, optimizer, backend, self.precision, config, self.batches)
        else:
            # Wrap first: Horovod's DistributedOptimizer is a new optimizer over the same parameters.
            with backend.activity.waiting("the broadcast of rank 0's weights"):  # wrap() broadcasts them
                self.model, self.optimizer = backend.wrap(model, optimizer)
            self.plain_model = backend.unwrap(self.model)
            self.step = AllreduceStep(self.model, self.plain_model, self.optimizer, backend, self.precision,
                                      config.clip_grad_norm, gradient_disturbance(
                                          config.perturb_ulp, config.perturb_pattern, config.gradient_precision))
        self.timer = StepTimer(backend.device)
        self.loss_watch = LossWatch(backend.device)
        self.profiler = StepProfiler(backend.trace(os.path.join(config.run_dir, PROFILE_DIR)) if config.profile
                                     else None, config.profile)
        self.checkpointer = Checkpointer(
            config, backend, self.say, run_settings(config, self.inputs.info.image_size, self.batches.global_batch),
            model=self.plain_model, optimizer=self.optimizer, precision=self.precision, step=self.step)
        loaded = self.checkpointer.find(config.resume)
        if loaded is None:
            torch.manual_seed(config.seed + backend.rank)  # per-rank stream for dropout, the same on both backends
            self.position = Position.start(backend.device)
        else:
            self.load_state_dict(loaded)

    # --- training ----------------------------------------------------------------------------------
    def fit(self) -> int:
        """Train from the current position to the last step, then evaluate and write the results."""
        self.open_run_dir()
        train: Dict[str, float] = {}
        evaluation: Dict[str, float] = {}
        while self.position.epoch < self.config.epochs and self.position.step < self.batches.total_steps:
            train, evaluated = self.train_epoch()
            evaluation = evaluated or evaluation
        self.profiler.close()
        return self.finish(train, evaluation or self.evaluate())

    def train_epoch(self) -> Tuple[Dict[str, float], Optional[Dict[str, float]]]:
        """Train the rest of the current epoch; returns its training metrics and evaluation (if due)."""
        config, backend, pos, timer = self.config, self.backend, self.position, self.timer
        epoch, accumulate = pos.epoch, config.accumulate
        self.model.train()
        timer.start_epoch()
        bar = epoch_bar(config.progress, backend.is_main, epoch, self.batches.steps_per_epoch, pos.batch // accumulate)
        backend.activity.set("loading data")
        for group in self.batches.epoch(epoch, skip=pos.batch):
            timer.fetched()
            backend.activity.set(self.step.doing)
            lr = self.lr_at(pos.step)
            set_lr(self.optimizer, lr)
            loss, samples = self.step(group, pos.meter, pos.step)
            data_s, step_s, comm_s = timer.stepped(self.step.take_comm_seconds())
            self.loss_watch.observe(loss, pos.step + 1)
            pos.advance(accumulate)
            backend.activity.step = pos.step  # what this rank answers to pings
            self.profiler.after_step()
            bar.update(1)
            last = pos.step >= self.batches.total_steps
            checkpoint_due = self.checkpointer.due(pos.step, at_end=last or self.batches.finished(pos.batch))
            if pos.step % config.log_every == 0 or checkpoint_due or last:
                self.loss_watch.check()
                loss_value = loss.item()
                bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
                self.files.log("step", epoch=epoch, step=pos.step, loss=loss_value, lr=lr, batch=samples,
                                 data_s=data_s, step_s=step_s, comm_s=comm_s,
                                 wnorm=weight_norms(self.plain_model) if backend.is_main else None)
            if checkpoint_due:
                self.save_checkpoint()
            signum = None if last else self.stop.agreed(pos.step)
            if signum:
                if not checkpoint_due:
                    self.save_checkpoint()
                self.stopped(signum)
            timer.next_fetch()
            backend.activity.set("loading data")
            if last:
                break
        bar.close()
        return self.end_epoch()

    def end_epoch(self) -> Tuple[Dict[str, float], Optional[Dict[str, float]]]:
        """The epoch's metrics over all ranks, its evaluation when due, its log line and checkpoint."""
        config, backend, pos = self.config, self.backend, self.position
        record = {"epoch": pos.epoch, "step": pos.step, **self.timer.end_epoch(self.batches.global_batch)}
        sums = pos.meter.values() if self.step.global_meter else backend.all_reduce_sum(pos.meter.values())
        train = epoch_means(sums)
        record.update(train_loss=train["loss"], train_top1=train["top1"], samples=train["samples"],
                      lr=self.lr_at(max(pos.step - 1, 0)))
        evaluation = None
        if (pos.epoch + 1) % config.eval_every == 0 or pos.epoch == config.epochs - 1 \
                or pos.step >= self.batches.total_steps:
            evaluation = self.evaluate()
            scores = {f"val_{k}": v for k, v in evaluation.items()}
            record.update(scores)
            self.files.log("eval", epoch=pos.epoch, step=pos.step, **scores)
        self.files.log("epoch", **record)
        if backend.is_main:
            print(epoch_line(record, self.batches.total_steps), flush=True)
        self.save_checkpoint()
        if self.batches.finished(pos.batch):
            self.position = pos.next_epoch()
        more = self.position.epoch < config.epochs and pos.step < self.batches.total_steps
        signum = self.stop.agreed(pos.step, now=True) if more else None  # a signal during evaluation
        if signum:
            self.stopped(signum)
        return train, evaluation

    def stopped(self, signum: int) -> None:
        """Stop at the agreed signal; the checkpoint of this step is written."""
        self.files.log("stopped", epoch=self.position.epoch, step=self.position.step, signal=signum)
        raise Interrupted(signum, self.position.step)

    def finish(self, train: Dict[str, float], evaluation: Dict[str, float]) -> int:
        """Rank 0's buffers everywhere, then summary.json and model.pt (checked for non-finite values)."""
        backend, pos = self.backend, self.position
        backend.broadcast_buffers(self.plain_model)
        self.loss_watch.check()
        check_weights(backend, self.plain_model, pos.step, MODEL_FILE)
        state = self.plain_model.state_dict()
        summary = summary_record(RunOutcome(self.config, backend, pos, self.batches, self.timer, self.step, train,
                                            evaluation, state))
        self.files.log("summary", **summary)
        self.files.save_model(state)
        self.files.write_json(SUMMARY_FILE, summary)
        if backend.is_main:
            print(done_line(summary, self.config.run_dir), flush=True)
        backend.barrier()
        return 0

    # --- helpers of the loop -----------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """The learning rate of global step `step` (0-based) at this world size."""
        return lr_at(self.config, step, self.batches.steps_per_epoch, self.batches.total_steps,
                     self.backend.world_size)

    def evaluate(self) -> Dict[str, float]:
        """Exact validation of the current weights (a collective)."""
        return evaluate(self.plain_model, self.batches.val_loader, self.backend, self.precision,
                        self.batches.on_device)

    def save_checkpoint(self) -> None:
        """A checkpoint of where training stands (a collective); its write is left out of the timing."""
        self.backend.activity.set("writing a checkpoint")
        with self.timer.pause():
            state = self.state_dict()
            path = self.checkpointer.save(state)
            if path:
                self.files.log("checkpoint", epoch=state["epoch"], step=state["step"], path=path)

    # --- the state of training ---------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Where training stands, as a checkpoint holds it (a collective: every rank's RNG state and
        partial sums). Built on rank 0 only, unless every rank keeps checkpoints (Horovod elastic)."""
        self.loss_watch.check()
        return self.checkpointer.state(self.position, finished=self.batches.finished(self.position.batch))

    def load_state_dict(self, state: Dict[str, Any], origin: Optional[str] = None) -> None:
        """Continue from a checkpoint's state: weights, optimizer, loss scale, RNG and position. At another
        world size (only from an epoch boundary: an epoch's sample order depends on the world size) the
        loaders are rebuilt and the rest of the run is counted at the new world's steps per epoch."""
        self.batches = self.batches.placed_for(self.backend)  # an elastic job may have changed its members
        self.position = self.checkpointer.restore(state, origin or state["path"], self.batches)

    # --- the run directory -------------------------------------------------------------------------
    def open_run_dir(self) -> None:
        """Rank 0 opens the run directory (keeping the events up to a resumed step) and writes config.json
        (a collective: every rank's host)."""
        rank_hosts = self.backend.all_gather_object(self.backend.host())
        self.close_run_dir()
        pos = self.position
        self.run_dir = RunDir(self.config.run_dir, self.backend.is_main, tensorboard=self.config.tensorboard)
        self.run_dir.open(keep_until_step=pos.step if pos.resumed_from else None)
        self.files.write_json(CONFIG_FILE, config_record(RunSetup(
            self.config, self.backend, rank_hosts, self.threads, self.inputs, self.batches, self.plain_model,
            self.precision, self.profiler, pos.resumed_from)))
        for note in pos.notes:
            self.files.log("note", step=pos.step, message=note)
        # The weights training starts from (after the broadcast or a resume): the step events' wnorm continue it.
        self.files.log("start", step=pos.step, wnorm=weight_norms(self.plain_model) if self.backend.is_main else None)

    @property
    def files(self) -> RunDir:
        """The run directory fit() opened."""
        if self.run_dir is None:
            raise RuntimeError("the run directory is written before fit() opened it")
        return self.run_dir

    def close_run_dir(self) -> None:
        """Close the run directory's files, if it was opened."""
        if self.run_dir is not None:
            self.run_dir.close()

    def note(self, message: str) -> None:
        """A note event for metrics.jsonl, written when the run directory is (re)opened."""
        self.position.note(message)

    def say(self, message: str) -> None:
        """A line on rank 0's output."""
        if self.backend.is_main:
            print(f"{self.prog}: {message}", flush=True)


def run(config: Config, backend: Backend, prog: str = "train",
        fit: Optional[Callable[[Trainer], int]] = None) -> int:
    """Train `config` on `backend`; the whole program behind both entry points. `fit` replaces
    Trainer.fit when the launcher drives training itself (Horovod elastic)."""
    return Trainer(config, backend, prog).run(fit)
