"""THE training loop. Both backends run exactly this code; they differ only behind the Backend seam."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import psutil
import torch
import torch.nn.functional as F

from . import checkpoint as ckpt_io
from .backend import Backend
from .config import AMP_FP16_NEEDS_CUDA, Config, UsageError, fail_usage
from .data import make_loaders, open_datasets
from .metrics import Clock, SumMeter, TimeSplit, topk_correct
from .models import build_model, check_model_fits, gradient_bytes
from .optim import lr_at, make_optimizer, set_lr
from .precision import Precision
from .profiling import PROFILE_DIR, StepProfiler
from .progress import epoch_bar
from .watchdog import ProgressWatchdog
from .rundir import RunDir, command_line, detect_launcher, versions, weights_sha256

TRAIN_METRICS = ["loss", "correct"]


def default_threads(local_world_size: int) -> int:
    """Cores this process may use divided among the job's processes on this host (at least 1).

    Set explicitly on every backend: torchrun exports OMP_NUM_THREADS=1 and horovodrun does not,
    and the thread count can change both speed and the floating-point result.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(local_world_size, 1))


#: steps between the ranks' checks for a stop request (a tiny collective each time)
STOP_CHECK_EVERY = 5
#: how much longer than --timeout the progress watchdog waits (the backends' own timeouts go first)
WATCHDOG_GRACE_S = 10.0


class Interrupted(Exception):
    """SIGINT/SIGTERM asked the job to stop; a checkpoint was written at `step`."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(signum, step)
        self.signum, self.step = signum, step


class TrainingStopped(Exception):
    """Training cannot go on (non-finite loss); the message says why. Exit code 1."""


@dataclass
class Position:
    """Where training stands: the epoch being trained, batches of it already done, global steps."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    meter: Optional[List[float]] = None  # this rank's partial sums of the current epoch
    resumed_from: Optional[str] = None
    notes: List[str] = field(default_factory=list)


class Trainer:
    """One run: data, model and optimizer on a backend, the epoch loop, checkpoints, the run directory."""

    def __init__(self, config: Config, backend: Backend, prog: str) -> None:
        self.config = config
        self.backend = backend
        self.prog = prog

    # --- set-up ------------------------------------------------------------------------------
    def check_inputs(self):
        """Open the data and check the model and run dir on every rank, before any collective."""
        config = self.config
        try:
            self.backend.check_environment()
            train_set, val_set, info = open_datasets(config)
            check_model_fits(config.model, info.image_size)
        except (UsageError, ValueError) as exc:
            fail_usage(self.prog, str(exc))
        if self.backend.rank == 0:
            problem = RunDir.check_writable(config.run_dir)
            if problem:
                fail_usage(self.prog, problem + "; choose another --run-dir")
        if config.resume not in (None, "auto") and not os.path.isfile(config.resume):
            fail_usage(self.prog, f"--resume {config.resume!r}: no such file; pass a checkpoint file or 'auto'")
        return train_set, val_set, info

    def run(self) -> int:
        """Train, evaluate and write the run directory. Returns the process exit code."""
        train_set, val_set, info = self.check_inputs()
        try:
            self.backend.select_device(self.config.device)
        except RuntimeError as exc:
            fail_usage(self.prog, str(exc))
        config = self.config
        if config.amp == "fp16" and self.backend.device.type != "cuda":
            fail_usage(self.prog, AMP_FP16_NEEDS_CUDA)
        # Built before init: the backend may tune itself to the model's size (Horovod's cycle time).
        self._initial_model = build_model(config.model, info.channels, info.image_size, info.num_classes, config.seed)
        self.backend.configure(compression=config.compression, bucket_mb=config.bucket_mb,
                               accumulate=config.accumulate, profile=config.profile > 0,
                               gradient_bytes=gradient_bytes(self._initial_model))
        self.stop_signal: Optional[int] = None
        try:
            self.backend.init(self.config.timeout)
        except UsageError as exc:  # e.g. the rendezvous port is taken
            fail_usage(self.prog, str(exc))
        self._install_stop_handlers()  # after init: MPI may install handlers of its own
        # The backend's own timeouts should fire first; the watchdog covers waits that have none.
        self.watchdog = ProgressWatchdog(self.config.timeout + WATCHDOG_GRACE_S, self._no_progress)
        try:
            self._setup(train_set, val_set, info)
            return self.backend.run_training(self._train, self)
        except ckpt_io.CheckpointError as exc:
            fail_usage(self.prog, str(exc))
        except TrainingStopped as exc:
            print(f"[rank {self.backend.rank}] {self.prog}: error: {exc}", file=sys.stderr, flush=True)
            return 1
        except Interrupted as stop:
            self._say(f"stopped by {signal.Signals(stop.signum).name} at step {stop.step}; checkpoint written, "
                      "continue with --resume auto")
            return 128 + stop.signum
        except Exception:  # noqa: BLE001 - any other failure ends this rank, loudly and at once
            traceback.print_exc()
            stall = self.backend.explain_stall()
            if stall:
                print(f"[rank {self.backend.rank}] {self.prog}: error: {stall}", file=sys.stderr, flush=True)
            print(f"[rank {self.backend.rank}] {self.prog}: error: rank {self.backend.rank} failed "
                  f"(traceback above); the launcher stops the other ranks", file=sys.stderr, flush=True)
            sys.stdout.flush()
            # No graceful shutdown: the other ranks may be waiting in a collective that will never
            # complete, and a clean shutdown would wait for them too.
            os._exit(1)
        finally:
            self.watchdog.stop()
            if getattr(self, "run_dir", None) is not None:
                self.run_dir.close()
            self.backend.shutdown()

    def _no_progress(self, idle_s: float) -> None:
        """Watchdog expiry: say what is known about the stall, then end this rank at once."""
        rank = self.backend.rank
        print(f"[rank {rank}] {self.prog}: error: no progress for {idle_s:.0f} s at step "
              f"{self.backend.current_step} (--timeout {self.config.timeout:g}); another rank stopped taking "
              "part in a collective", file=sys.stderr, flush=True)
        stall = self.backend.explain_stall()
        if stall:
            print(f"[rank {rank}] {self.prog}: error: {stall}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)

    def _install_stop_handlers(self) -> None:
        """First SIGINT/SIGTERM: finish the step, agree with the other ranks, checkpoint and stop.
        A second one: stop at once (the default action)."""

        def request_stop(signum, frame):
            self.stop_signal = signum
            signal.signal(signum, signal.SIG_DFL)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, request_stop)

    def _stop_agreed(self) -> Optional[int]:
        """If any rank was asked to stop (a collective): the signal this rank saw, or SIGTERM
        when the request reached only other ranks."""
        (asking,) = self.backend.all_reduce_sum([1.0 if self.stop_signal else 0.0])
        return (self.stop_signal or int(signal.SIGTERM)) if asking else None

    def _setup(self, train_set, val_set, info) -> None:
        config, backend = self.config, self.backend
        self.device = device = backend.device
        self.threads = config.threads or default_threads(backend.local_world_size)
        torch.set_num_threads(self.threads)
        print(f"[{backend.name}] rank {backend.rank}/{backend.world_size} local_rank "
              f"{backend.local_rank}/{backend.local_world_size} host {backend.host()} device {device} "
              f"threads {self.threads}", flush=True)

        self.train_set, self.val_set, self.info = train_set, val_set, info
        self._build_loaders()
        self.settings = {"model": config.model, "dataset": config.dataset, "image_size": info.image_size,
                         "batch_size": config.batch_size, "seed": config.seed, "lr": config.lr,
                         "lr_scaling": config.lr_scaling, "accumulate": config.accumulate}

        model, self._initial_model = self._initial_model, None
        loaded = self._load_checkpoint()
        if loaded is not None:
            model.load_state_dict(loaded["model"])
        model = model.to(device, memory_format=torch.channels_last if config.channels_last else torch.preserve_format)
        self.precision = Precision(config.amp, device)
        optimizer = make_optimizer(config, model.parameters())
        # Wrap first: Horovod's DistributedOptimizer is a new optimizer over the same parameters.
        self.model, self.optimizer = backend.wrap(model, optimizer)
        self.plain_model = backend.unwrap(self.model)
        self.position = self._resume_position(loaded)
        self.profiler = StepProfiler(backend.trace(os.path.join(config.run_dir, PROFILE_DIR)) if config.profile
                                     else None, config.profile)
        self.run_dir = None
        if not backend.elastic:  # an elastic job opens it once its members are known (rejoin)
            self.open_run_dir(keep_until_step=self.position.step if loaded is not None else None)

    def _build_loaders(self) -> None:
        """Loaders and step counts for this rank at the current world size."""
        config, backend = self.config, self.backend
        self.train_loader, self.val_loader, self.sampler = make_loaders(
            config, self.train_set, self.val_set, backend.rank, backend.world_size,
            pin_memory=self.device.type == "cuda")
        # A step is one optimizer step over --accumulate micro-batches (loader batches); the epoch's
        # incomplete tail of micro-batches is dropped. Position.batch counts micro-batches.
        self.steps_per_epoch = len(self.train_loader) // config.accumulate
        self.batches_per_epoch = self.steps_per_epoch * config.accumulate
        self.global_batch = config.batch_size * backend.world_size * config.accumulate
        if self.steps_per_epoch == 0:
            fail_usage(self.prog, f"--accumulate {config.accumulate} is more than the {len(self.train_loader)} "
                                  "batches per rank in an epoch; lower --accumulate or --batch-size")
        self.total_steps = config.epochs * self.steps_per_epoch
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)

    def open_run_dir(self, keep_until_step: Optional[int]) -> None:
        """Rank 0 opens the run directory and writes config.json (a collective: every rank's host)."""
        config, backend, info = self.config, self.backend, self.info
        train_set, val_set, device = self.train_set, self.val_set, self.device
        hosts = backend.all_gather_object(backend.host())
        if self.run_dir is not None:
            self.run_dir.close()
        self.run_dir = RunDir(config.run_dir, backend.is_main, tensorboard=config.tensorboard)
        self.run_dir.open(keep_until_step=keep_until_step)
        self.run_dir.write_json("config.json", {
            "config": config.to_dict(),
            "backend": backend.describe(),
            "world_size": backend.world_size,
            "hosts": sorted(set(hosts)),
            "rank_hosts": hosts,
            "launcher": detect_launcher(),
            "command": command_line(),
            "threads": self.threads,
            "device": str(device),
            "dataset": {"train_samples": len(train_set), "val_samples": len(val_set),
                        "channels": info.channels, "image_size": info.image_size,
                        "num_classes": info.num_classes},
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "global_batch": self.global_batch,
            "micro_batches_per_step": config.accumulate,
            "precision": self.precision.describe(),
            "profile": self.profiler.describe(),
            "resumed_from": self.position.resumed_from,
            "versions": versions(),
        })
        for note in self.position.notes:
            self.run_dir.log("note", step=self.position.step, message=note)

    # --- checkpoints ---------------------------------------------------------------------------
    def _load_checkpoint(self) -> Optional[Dict]:
        """The checkpoint to resume from (every rank reads the same file), or None."""
        config = self.config
        if config.resume is None:
            return None
        if config.resume == "auto":
            loaded, path, problems = ckpt_io.find_newest_valid(config.run_dir)
            for problem in problems:
                self._say(f"skipping checkpoint: {problem}")
            if loaded is None:
                self._say(f"--resume auto: no valid checkpoint in {config.run_dir}; starting fresh")
                return None
        else:
            path = config.resume
            loaded = ckpt_io.check_format(ckpt_io.verified_load(path), path)
        ckpt_io.check_matches(loaded, self.settings, path)
        loaded["path"] = path
        return loaded

    def _resume_position(self, loaded: Optional[Dict]) -> Position:
        """Restore optimizer and RNG state and say where training continues."""
        backend, config = self.backend, self.config
        if loaded is None:
            # Per-rank stream for dropout and the like, the same on both backends.
            torch.manual_seed(config.seed + backend.rank)
            return Position()
        self.optimizer.load_state_dict(loaded["optimizer"])
        self.precision.load_state_dict(loaded.get("scaler"))
        position = Position(epoch=int(loaded["epoch"]), batch=int(loaded["batch"]), step=int(loaded["step"]),
                            resumed_from=loaded["path"])
        old_world = int(loaded["world_size"])
        if old_world == backend.world_size:
            torch.set_rng_state(loaded["rng"][backend.rank])
            position.meter = [float(v) for v in loaded["meter"][backend.rank]]
        elif position.batch != 0:
            raise ckpt_io.CheckpointError(
                f"{loaded['path']} was written mid-epoch (epoch {position.epoch + 1}, batch {position.batch}) at "
                f"world size {old_world}; a different world size ({backend.world_size}) can only resume from an "
                "epoch-end checkpoint, since the sample order of an epoch depends on the world size")
        else:
            torch.manual_seed(config.seed + backend.rank + 1_000 * position.epoch)
            old_lr = lr_at(config, position.step, self.steps_per_epoch, self.total_steps, old_world)
            # The rest of the run goes at the new world's steps per epoch; step and cosine schedules end there.
            self.total_steps = position.step + (config.epochs - position.epoch) * self.steps_per_epoch
            if config.max_steps is not None:
                self.total_steps = min(self.total_steps, config.max_steps)
            new_lr = lr_at(config, position.step, self.steps_per_epoch, self.total_steps, backend.world_size)
            note = (f"world size changed {old_world} -> {backend.world_size} at the start of epoch "
                    f"{position.epoch + 1}: global batch {config.batch_size * old_world * config.accumulate} -> "
                    f"{self.global_batch}, lr {old_lr:g} -> {new_lr:g}"
                    + (" (--lr-scaling linear)" if config.lr_scaling == "linear" else ""))
            position.notes.append(note)
            self._say(note)
        self._say(f"resuming from {loaded['path']}: epoch {position.epoch + 1}, batch {position.batch}, "
                  f"step {position.step}")
        return position

    def checkpoint_state(self, epoch: int, batch: int, step: int, meter: SumMeter) -> Dict:
        """What a checkpoint holds (a collective: every rank's RNG state and partial sums). Built on
        rank 0 only, or on every rank when the backend keeps it for an elastic restart."""
        backend = self.backend
        rng, meters = zip(*backend.all_gather_object((torch.get_rng_state(), meter.values())))
        if not (backend.is_main or backend.elastic):
            return {}
        return {
            "format": ckpt_io.FORMAT,
            "model": {k: v.detach().cpu() for k, v in self.plain_model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "epoch": epoch, "batch": batch, "step": step,
            "world_size": backend.world_size, "backend": backend.name,
            "settings": self.settings, "rng": list(rng), "meter": list(meters),
            "scaler": self.precision.state_dict(),
        }

    def _save_checkpoint(self, epoch: int, batch: int, step: int, meter: SumMeter) -> None:
        """Every rank contributes its RNG state and partial sums; rank 0 writes; all wait for it.
        An elastic backend then commits the same state as the one to go back to after a failure."""
        backend = self.backend
        self.watchdog.beat()
        state = self.checkpoint_state(epoch, batch, step, meter)
        if backend.is_main:
            path = ckpt_io.checkpoint_path(self.config.run_dir, step)
            ckpt_io.atomic_save(state, path)
            ckpt_io.prune(self.config.run_dir, self.config.keep_checkpoints)
            self.watchdog.beat()
            self.run_dir.log("checkpoint", epoch=epoch, step=step, path=path)
        backend.barrier()
        backend.commit(state)

    def start_state(self) -> Dict:
        """The checkpoint state of where this run starts (a collective)."""
        pos = self.position
        meter = SumMeter(TRAIN_METRICS, self.device)
        if pos.meter is not None:
            meter.load(pos.meter)
        return self.checkpoint_state(pos.epoch, pos.batch, pos.step, meter)

    def restore(self, state: Dict, origin: str) -> None:
        """Continue from `state` (a checkpoint dict) after an elastic job's membership changed:
        loaders for the new world, weights, optimizer and position; the run directory is reopened,
        since rank 0 may now be another process."""
        self._build_loaders()
        self.plain_model.load_state_dict(state["model"])
        self.position = self._resume_position(dict(state, path=origin))
        self.open_run_dir(keep_until_step=self.position.step)
        self.run_dir.log("note", step=self.position.step,
                         message=f"elastic: {self.backend.world_size} ranks continue from {origin}")

    # --- training ------------------------------------------------------------------------------
    def _train(self) -> int:
        config, backend, pos = self.config, self.backend, self.position
        accumulate = config.accumulate
        clock = Clock(self.device)
        # The run's time split leaves out its first step (allocation, warm-up), as samples/s does;
        # a run of one step reports that step.
        split, first_split = TimeSplit(), TimeSplit()
        last_eval: Dict[str, float] = {}
        last_train: Dict[str, float] = {}
        train_seconds = timed_samples = 0.0
        step = pos.step
        steps_this_run = 0
        epochs_done = pos.epoch

        for epoch in range(pos.epoch, config.epochs):
            if step >= self.total_steps:
                break
            skip = pos.batch if epoch == pos.epoch else 0
            self.sampler.set_epoch(epoch)
            self.sampler.skip = skip * config.batch_size
            meter = SumMeter(TRAIN_METRICS, self.device)
            if skip and pos.meter is not None:
                meter.load(pos.meter)
            self.model.train()
            epoch_split = TimeSplit()
            # data: the wait for the loader alone (from fetch_start); the bookkeeping after a step (logs,
            # checkpoints, stop checks) counts as compute of the next step, whose time runs from t_prev.
            epoch_start = t_prev = fetch_start = clock.now()
            batch = skip
            first_step_s = checkpoint_s = 0.0
            bar = epoch_bar(config.progress, backend.is_main, epoch, self.steps_per_epoch, skip // accumulate)
            # One optimizer step per group of --accumulate micro-batches; an incomplete last group is dropped.
            for group in grouped(self.train_loader, accumulate):
                group = [(self._to_device(images), labels.to(self.device, non_blocking=True))
                         for images, labels in group]
                t_data = clock.now()
                data_s = t_data - fetch_start
                lr = lr_at(config, step, self.steps_per_epoch, self.total_steps, backend.world_size)
                set_lr(self.optimizer, lr)
                self.optimizer.zero_grad()  # set_to_none (the default); Horovod takes no argument
                loss, n = self._forward_backward(group, meter)
                with backend.gradients_ready(self.optimizer):
                    self.precision.unscale(self.optimizer)
                    if config.clip_grad_norm is not None:
                        torch.nn.utils.clip_grad_norm_(self.plain_model.parameters(), config.clip_grad_norm)
                backend.step(self.optimizer, self.precision.scaler)
                t_end = clock.now()

                comm = backend.take_comm_seconds()
                phases = (data_s, max(t_end - t_prev - data_s - comm, 0.0), comm)
                epoch_split.add(*phases)
                (split if steps_this_run else first_split).add(*phases)
                step += 1
                batch += accumulate
                steps_this_run += 1
                backend.note_step(step)
                self.watchdog.beat()
                self.profiler.after_step()
                bar.update(1)
                if steps_this_run == 1:
                    first_step_s = t_end - epoch_start
                checkpoint_due = (config.checkpoint_every and step % config.checkpoint_every == 0
                                  and batch < self.batches_per_epoch and step < self.total_steps)
                if step % config.log_every == 0 or checkpoint_due or step == self.total_steps:
                    loss_value = loss.item()
                    if not math.isfinite(loss_value):
                        raise TrainingStopped(
                            f"loss is {loss_value} at step {step}; stopping without writing a checkpoint "
                            "(the last good one is kept); lower --lr or check the data")
                    bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
                    self.run_dir.log("step", epoch=epoch, step=step, loss=loss_value, lr=lr, batch=n,
                                     data_s=data_s, step_s=t_end - t_prev, comm_s=comm)
                if checkpoint_due:
                    self._save_checkpoint(epoch, batch, step, meter)
                    checkpoint_s += clock.now() - t_end
                t_prev = clock.now() if checkpoint_due else t_end
                if step % STOP_CHECK_EVERY == 0 and step < self.total_steps:
                    signum = self._stop_agreed()
                    if signum:
                        if batch >= self.batches_per_epoch:
                            self._save_checkpoint(epoch + 1, 0, step, SumMeter(TRAIN_METRICS, self.device))
                        elif not checkpoint_due:
                            self._save_checkpoint(epoch, batch, step, meter)
                        self.run_dir.log("stopped", epoch=epoch, step=step, signal=signum)
                        raise Interrupted(signum, step)
                fetch_start = clock.now()
                if step >= self.total_steps:
                    break
            bar.close()
            epoch_seconds = clock.now() - epoch_start
            epochs_done = epoch + 1

            train = SumMeter.means(TRAIN_METRICS, backend.all_reduce_sum(meter.values()))
            last_train = {"loss": train["loss"], "top1": train["correct"]}
            epoch_samples = float(epoch_split.steps * self.global_batch)
            # Throughput leaves out the first step of the run (allocation, warm-up) and checkpoint writes.
            warm = first_step_s if epoch == pos.epoch else 0.0
            if epoch_split.steps > (1 if warm else 0):
                train_seconds += epoch_seconds - warm - checkpoint_s
                timed_samples += epoch_samples - (self.global_batch if warm else 0)

            record = {"epoch": epoch, "step": step, "train_loss": train["loss"], "train_top1": train["correct"],
                      "lr": lr_at(config, max(step - 1, 0), self.steps_per_epoch, self.total_steps,
                                  backend.world_size),
                      "samples": train["count"], "epoch_s": epoch_seconds,
                      "samples_per_s": epoch_samples / epoch_seconds if epoch_seconds > 0 else None,
                      "time_split": epoch_split.per_step_ms()}
            finished_epoch = batch >= self.batches_per_epoch
            last = epoch == config.epochs - 1 or step >= self.total_steps
            if (epoch + 1) % config.eval_every == 0 or last:
                last_eval = self.evaluate()
                record.update({f"val_{k}": v for k, v in last_eval.items()})
                self.run_dir.log("eval", epoch=epoch, step=step, **{f"val_{k}": v for k, v in last_eval.items()})
            self.run_dir.log("epoch", **record)
            if backend.is_main:
                print(self._epoch_line(epoch, step, record), flush=True)
            if finished_epoch:
                self._save_checkpoint(epoch + 1, 0, step, SumMeter(TRAIN_METRICS, self.device))
            else:
                self._save_checkpoint(epoch, batch, step, meter)

        self.profiler.close()
        if not last_eval:
            last_eval = self.evaluate()
        return self._finish(step, epochs_done, split if split.steps else first_split, last_train, last_eval,
                            train_seconds, timed_samples)

    def _finish(self, step, epochs_done, split, last_train, last_eval, train_seconds, timed_samples) -> int:
        backend, config = self.backend, self.config
        backend.broadcast_buffers(self.plain_model)
        state = self.plain_model.state_dict()
        summary = {
            "backend": backend.name,
            "backend_options": backend.describe(),
            "world_size": backend.world_size,
            "model": config.model,
            "dataset": config.dataset,
            "epochs": epochs_done,
            "steps": step,
            "resumed_from": self.position.resumed_from,
            "global_batch": self.global_batch,
            "samples_per_s": timed_samples / train_seconds if train_seconds > 0 else None,
            "train_s": train_seconds,
            "wall_s": time.time() - psutil.Process().create_time(),  # whole process, imports included
            "train_loss": last_train.get("loss"),
            "train_top1": last_train.get("top1"),
            "val_loss": last_eval.get("loss"),
            "val_top1": last_eval.get("top1"),
            "val_top5": last_eval.get("top5"),
            "time_split": split.per_step_ms(),
            "weights_sha256": weights_sha256(state),
        }
        self.run_dir.log("summary", **summary)
        self.run_dir.save_model(state)
        self.run_dir.write_json("summary.json", summary)
        if backend.is_main:
            print(f"done: {step} steps, val_top1 {summary['val_top1']:.4f}, "
                  f"{summary['samples_per_s'] or 0:.0f} samples/s, run dir {os.path.abspath(config.run_dir)}",
                  flush=True)
        backend.barrier()
        return 0

    # --- evaluation ------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> Dict[str, float]:
        """Exact validation loss, top-1 and top-5 over the whole validation set (every sample
        once across ranks), evaluated with rank 0's buffers."""
        backend, device, model = self.backend, self.device, self.plain_model
        backend.broadcast_buffers(model)
        model.eval()
        meter = SumMeter(["loss", "top1", "top5"], device)
        for images, labels in self.val_loader:
            images, labels = self._to_device(images), labels.to(device)
            with self.precision.autocast():
                logits = model(images)
            self.watchdog.beat()
            top1, top5 = topk_correct(logits, labels, (1, 5))
            meter.add(labels.size(0), loss=F.cross_entropy(logits, labels, reduction="sum"), top1=top1, top5=top5)
        model.train()
        means = SumMeter.means(["loss", "top1", "top5"], backend.all_reduce_sum(meter.values()))
        return {"loss": means["loss"], "top1": means["top1"], "top5": means["top5"], "samples": means["count"]}

    def _to_device(self, images: torch.Tensor) -> torch.Tensor:
        """Inputs on this rank's device, in channels-last memory format when asked (4-D only)."""
        images = images.to(self.device, non_blocking=True)
        if self.config.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def _forward_backward(self, group, meter: SumMeter):
        """Forward and backward over the micro-batches of one optimizer step. Each micro-batch's
        mean loss counts 1/K; gradients add up locally and are exchanged after the last backward.
        Returns (the step's loss: the mean of the micro-batch losses, samples in the step)."""
        k = len(group)
        step_loss, samples = 0.0, 0
        for i, (images, labels) in enumerate(group):
            exchange = i == k - 1
            with contextlib.nullcontext() if exchange else self.backend.accumulating(self.model):
                with self.precision.autocast():
                    logits = self.model(images)
                    loss = F.cross_entropy(logits, labels)
                self.precision.scale(loss / k).backward()
            n = labels.size(0)
            meter.add(n, loss=loss.detach() * n, correct=(logits.detach().argmax(dim=1) == labels).sum())
            step_loss = step_loss + loss.detach()
            samples += n
        return step_loss / k, samples

    def _say(self, message: str) -> None:
        if self.backend.is_main:
            print(f"{self.prog}: {message}", flush=True)

    def _epoch_line(self, epoch: int, step: int, r: dict) -> str:
        line = (f"epoch {epoch + 1} step {step}/{self.total_steps} train_loss {r['train_loss']:.4f} "
                f"train_top1 {r['train_top1']:.4f}")
        if "val_top1" in r:
            line += f" val_loss {r['val_loss']:.4f} val_top1 {r['val_top1']:.4f} val_top5 {r['val_top5']:.4f}"
        if r.get("samples_per_s"):
            line += f" {r['samples_per_s']:.0f} samples/s"
        return line


def grouped(iterable, k: int):
    """Consecutive lists of `k` items; an incomplete last list is dropped."""
    it = iter(iterable)
    while True:
        group = list(itertools.islice(it, k))
        if len(group) < k:
            return
        yield group


def run(config: Config, backend: Backend, prog: str = "train") -> int:
    """Train `config` on `backend`; the whole program behind both entry points."""
    return Trainer(config, backend, prog).run()
