"""THE training loop. Both backends run exactly this code; they differ only behind the Backend seam."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Dict

import psutil
import torch
import torch.nn.functional as F

from .backend import Backend
from .config import Config, UsageError, fail_usage
from .data import make_loaders, open_datasets
from .metrics import Clock, SumMeter, TimeSplit, topk_correct
from .models import build_model, check_model_fits
from .optim import lr_at, make_optimizer, set_lr
from .rundir import (RunDir, command_line, detect_launcher, versions, weights_sha256)


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


class Trainer:
    """One run: data, model and optimizer on a backend, the epoch loop, and the run directory."""

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
        return train_set, val_set, info

    def run(self) -> int:
        """Train, evaluate and write the run directory. Returns the process exit code."""
        config, backend = self.config, self.backend
        train_set, val_set, info = self.check_inputs()
        try:
            backend.select_device(config.device)
        except RuntimeError as exc:
            fail_usage(self.prog, str(exc))
        backend.init()
        try:
            return self._run(train_set, val_set, info)
        finally:
            backend.shutdown()

    def _run(self, train_set, val_set, info) -> int:
        config, backend = self.config, self.backend
        device = backend.device
        threads = config.threads or default_threads(backend.local_world_size)
        torch.set_num_threads(threads)
        print(f"[{backend.name}] rank {backend.rank}/{backend.world_size} local_rank "
              f"{backend.local_rank}/{backend.local_world_size} host {backend.host()} device {device} "
              f"threads {threads}", flush=True)

        train_loader, val_loader, sampler = make_loaders(
            config, train_set, val_set, backend.rank, backend.world_size, pin_memory=device.type == "cuda")
        steps_per_epoch = len(train_loader)
        total_steps = config.epochs * steps_per_epoch
        if config.max_steps is not None:
            total_steps = min(total_steps, config.max_steps)

        model = build_model(config.model, info.channels, info.image_size, info.num_classes, config.seed)
        model = model.to(device)
        optimizer = make_optimizer(config, model.parameters())
        model, optimizer = backend.wrap(model, optimizer)
        plain_model = backend.unwrap(model)
        # Per-rank stream for dropout and the like, the same on both backends.
        torch.manual_seed(config.seed + backend.rank)

        hosts = backend.all_gather_object(backend.host())
        run_dir = RunDir(config.run_dir, backend.is_main)
        run_dir.open()
        run_dir.write_json("config.json", {
            "config": config.to_dict(),
            "backend": backend.describe(),
            "world_size": backend.world_size,
            "hosts": sorted(set(hosts)),
            "rank_hosts": hosts,
            "launcher": detect_launcher(),
            "command": command_line(),
            "threads": threads,
            "device": str(device),
            "dataset": {"train_samples": len(train_set), "val_samples": len(val_set),
                        "channels": info.channels, "image_size": info.image_size,
                        "num_classes": info.num_classes},
            "steps_per_epoch": steps_per_epoch,
            "total_steps": total_steps,
            "global_batch": config.batch_size * backend.world_size,
            "versions": versions(),
        })

        clock = Clock(device)
        split = TimeSplit()
        step = 0
        train_seconds = 0.0
        global_samples_timed = 0.0
        last_eval: Dict[str, float] = {}
        last_train: Dict[str, float] = {}
        start = time.time()
        epochs_done = 0
        first_step_seconds = first_step_samples = 0.0

        for epoch in range(config.epochs):
            if step >= total_steps:
                break
            sampler.set_epoch(epoch)
            model.train()
            meter = SumMeter(["loss", "correct"], device)
            epoch_split = TimeSplit()
            epoch_start = clock.now()
            t_prev = epoch_start
            batches = iter(train_loader)
            while step < total_steps:
                try:
                    images, labels = next(batches)
                except StopIteration:
                    break
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                t_data = clock.now()

                lr = lr_at(config, step, steps_per_epoch, total_steps, backend.world_size)
                set_lr(optimizer, lr)
                optimizer.zero_grad()  # set_to_none (the default); Horovod takes no argument
                logits = model(images)
                loss = F.cross_entropy(logits, labels)
                loss.backward()
                with backend.gradients_ready(optimizer):
                    pass
                backend.step(optimizer)
                t_end = clock.now()

                comm = backend.take_comm_seconds()
                epoch_split.add(t_data - t_prev, max(t_end - t_data - comm, 0.0), comm)
                n = labels.size(0)
                correct = (logits.detach().argmax(dim=1) == labels).sum()
                meter.add(n, loss=loss.detach() * n, correct=correct)
                step += 1
                if step % config.log_every == 0 or step == total_steps:
                    loss_value = loss.item()
                    if not math.isfinite(loss_value):
                        print(f"[rank {backend.rank}] {self.prog}: error: loss is {loss_value} at step {step}; "
                              "lower --lr or check the data", file=sys.stderr, flush=True)
                        run_dir.close()
                        return 1
                    run_dir.log("step", epoch=epoch, step=step, loss=loss_value, lr=lr,
                                batch=n, data_s=t_data - t_prev, step_s=t_end - t_prev, comm_s=comm)
                if step == 1:
                    first_step_seconds = t_end - epoch_start
                    first_step_samples = float(n * backend.world_size)
                t_prev = t_end
            epoch_seconds = clock.now() - epoch_start
            epochs_done = epoch + 1

            totals = backend.all_reduce_sum(meter.values())
            train = SumMeter.means(["loss", "correct"], totals)
            last_train = {"loss": train["loss"], "top1": train["correct"]}
            global_samples = train["count"]
            timed_seconds, timed_samples = epoch_seconds, global_samples
            if epoch == 0 and epoch_split.steps > 1:
                # The first step (allocation, warm-up) is not part of the throughput.
                timed_seconds -= first_step_seconds
                timed_samples -= first_step_samples
            train_seconds += timed_seconds
            global_samples_timed += timed_samples
            split.merge(epoch_split)

            record = {"epoch": epoch, "step": step, "train_loss": train["loss"], "train_top1": train["correct"],
                      "lr": lr_at(config, max(step - 1, 0), steps_per_epoch, total_steps, backend.world_size),
                      "samples": global_samples, "epoch_s": epoch_seconds,
                      "samples_per_s": global_samples / epoch_seconds if epoch_seconds > 0 else None,
                      "time_split": epoch_split.per_step_ms()}
            last_epoch = epoch == config.epochs - 1 or step >= total_steps
            if (epoch + 1) % config.eval_every == 0 or last_epoch:
                last_eval = self.evaluate(model, plain_model, val_loader)
                record.update({f"val_{k}": v for k, v in last_eval.items()})
                run_dir.log("eval", epoch=epoch, step=step, **{f"val_{k}": v for k, v in last_eval.items()})
            run_dir.log("epoch", **record)
            if backend.is_main:
                print(self._epoch_line(epoch, step, total_steps, record), flush=True)

        backend.broadcast_buffers(plain_model)
        state = plain_model.state_dict()
        summary = {
            "backend": backend.name,
            "backend_options": backend.describe(),
            "world_size": backend.world_size,
            "model": config.model,
            "dataset": config.dataset,
            "epochs": epochs_done,
            "steps": step,
            "global_batch": config.batch_size * backend.world_size,
            "samples_per_s": global_samples_timed / train_seconds if train_seconds > 0 else None,
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
        run_dir.log("summary", **summary)
        run_dir.save_model(state)
        run_dir.write_json("summary.json", summary)
        run_dir.close()
        if backend.is_main:
            print(f"done: {step} steps, val_top1 {summary['val_top1']:.4f}, "
                  f"{summary['samples_per_s'] or 0:.0f} samples/s, run dir {os.path.abspath(config.run_dir)}",
                  flush=True)
        backend.barrier()
        return 0

    # --- evaluation ------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model, plain_model, val_loader) -> Dict[str, float]:
        """Exact validation loss, top-1 and top-5 over the whole validation set (every sample
        once across ranks), evaluated with rank 0's buffers."""
        backend, device = self.backend, self.backend.device
        backend.broadcast_buffers(plain_model)
        plain_model.eval()
        meter = SumMeter(["loss", "top1", "top5"], device)
        for images, labels in val_loader:
            images, labels = images.to(device), labels.to(device)
            logits = plain_model(images)
            top1, top5 = topk_correct(logits, labels, (1, 5))
            meter.add(labels.size(0), loss=F.cross_entropy(logits, labels, reduction="sum"), top1=top1, top5=top5)
        plain_model.train()
        means = SumMeter.means(["loss", "top1", "top5"], backend.all_reduce_sum(meter.values()))
        return {"loss": means["loss"], "top1": means["top1"], "top5": means["top5"], "samples": means["count"]}

    @staticmethod
    def _epoch_line(epoch: int, step: int, total_steps: int, r: dict) -> str:
        line = (f"epoch {epoch + 1} step {step}/{total_steps} train_loss {r['train_loss']:.4f} "
                f"train_top1 {r['train_top1']:.4f}")
        if "val_top1" in r:
            line += f" val_loss {r['val_loss']:.4f} val_top1 {r['val_top1']:.4f} val_top5 {r['val_top5']:.4f}"
        if r.get("samples_per_s"):
            line += f" {r['samples_per_s']:.0f} samples/s"
        return line


def run(config: Config, backend: Backend, prog: str = "train") -> int:
    """Train `config` on `backend`; the whole program behind both entry points."""
    return Trainer(config, backend, prog).run()
