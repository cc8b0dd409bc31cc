"""The run directory of a script the probe followed, written by rank 0 from every rank's records.

config.json names the script, its SHA-256, its arguments, the launcher and how the script joined the job;
metrics.jsonl has a `start` event (the weights training starts from, each rank's), a `stepless` event for each
optimizer step that had no backward before it, and one `step` event per training step with rank 0's loss, the
first param group's lr and the weights' fingerprint after the step (what the comparison's trajectories read),
plus what the causes are read from: every rank's loss and input fingerprints, every param group's settings,
the optimizer's state before the step, the gradients' norms; summary.json the run's totals and the checksum of
model.pt, rank 0's model at the end.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from common.rundir.names import CONFIG_FILE, SUMMARY_FILE
from common.rundir.records import versions
from common.rundir.writer import RunDir, weights_sha256

#: the probe's record files, per rank, inside the run directory
PROBE_DIR = "probe"


def rank_file(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, PROBE_DIR, f"rank-{rank}.jsonl")


def read_rank(run_dir: str, rank: int) -> List[Dict[str, Any]]:
    """A rank's records so far (a line being written is left out)."""
    records = []
    try:
        with open(rank_file(run_dir, rank)) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    except OSError:
        pass
    return records


def wait_for_ranks(run_dir: str, world_size: int, deadline: float) -> bool:
    """Whether every rank's record ended (its script finished) before `deadline` (time.monotonic)."""
    while True:
        ended = [any(r["event"] == "end" for r in read_rank(run_dir, rank)) for rank in range(world_size)]
        if all(ended):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _one(records: List[Dict[str, Any]], event: str) -> Dict[str, Any]:
    return next((r for r in records if r["event"] == event), {})


def write(run_dir: str, world_size: int, state: Dict[str, torch.Tensor]) -> None:
    """The run directory from every rank's records and `state`, rank 0's model at the end."""
    ranks = [read_rank(run_dir, rank) for rank in range(world_size)]
    first = ranks[0]
    probe, start, world = _one(first, "probe"), _one(first, "start"), _one(first, "world")
    precision = _one(first, "precision")
    steps_by_rank = [[r for r in records if r["event"] == "step"] for records in ranks]
    steps = steps_by_rank[0]
    out = RunDir(run_dir, True)
    out.open()
    out.save_model(state)
    backend = {"name": world.get("name", "local"), "controller": world.get("controller"),
               "process_group": world.get("process_group"), "script": True}
    settings = {"script": probe.get("script"), "script_sha256": probe.get("sha256"), "argv": probe.get("argv"),
                "perturb_ulp": probe.get("perturb_ulp", 0), "perturb_pattern": probe.get("perturb_pattern", 1),
                "max_steps": probe.get("max_steps")}
    hosts = [_one(records, "probe").get("host") for records in ranks]
    out.write_json(CONFIG_FILE, {
        "config": settings, "backend": backend, "world_size": world_size, "hosts": sorted(set(filter(None, hosts))),
        "rank_hosts": hosts, "launcher": probe.get("launcher"), "command": " ".join([probe.get("script") or "",
                                                                                    *(probe.get("argv") or [])]),
        "script": {"path": os.path.join(probe.get("cwd") or "", probe.get("script") or ""),
                   "sha256": probe.get("sha256"), "argv": probe.get("argv"), "cwd": probe.get("cwd")},
        "model": start.get("model"), "threads": start.get("threads"), "device": start.get("device"),
        "cores": probe.get("cores"), "ranks_per_host": probe.get("ranks_per_host"),
        "mpi_yield_when_idle": probe.get("mpi_yield_when_idle"), "mpi_yield_source": probe.get("mpi_yield_source"),
        "gradient_precision": precision.get("gradients"), "gradient_precision_how": precision.get("how"),
        "parameters": start.get("parameters"), "buffers": start.get("buffers"), "versions": versions()})
    out.log("start", step=0, wnorm=start.get("wnorm"), built=start.get("built"),
            ranks=[_one(records, "start").get("wnorm") for records in ranks],
            ranks_built=[_one(records, "start").get("built") for records in ranks])
    for event in (r for r in first if r["event"] == "stepless"):
        out.log("stepless", **{k: v for k, v in event.items() if k not in ("event", "time")})
    for index, step in enumerate(steps):
        others = [by_rank[index] if index < len(by_rank) else {} for by_rank in steps_by_rank]
        groups = step.get("groups") or [{}]
        out.log("step", step=step["step"], loss=step.get("loss"), lr=groups[0].get("lr"), wnorm=step.get("wnorm"),
                batch=sum(_batch(i) for i in step.get("inputs") or []), data_s=step.get("data_s"),
                step_s=(step.get("data_s") or 0) + (step.get("compute_s") or 0) + (step.get("comm_s") or 0),
                compute_s=step.get("compute_s"), comm_s=step.get("comm_s"), groups=groups,
                state=step.get("state"), gnorm=step.get("gnorm"), backwards=step.get("backwards"),
                ranks=[{"loss": o.get("loss"), "inputs": o.get("inputs"), "gnorm": o.get("gnorm")} for o in others])
    summary = _summary(steps_by_rank, backend, world_size, weights_sha256(state))
    summary["reduced_bytes_per_step"] = _one(first, "reduced").get("bytes")
    out.log("summary", **summary)
    out.write_json(SUMMARY_FILE, summary)
    out.close()


def _batch(fingerprint: Optional[Sequence[Any]]) -> int:  # an input fingerprint, as JSON gave it back
    return int(fingerprint[0][0]) if fingerprint and fingerprint[0] else 0


def time_split(timed: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Rank 0's mean time per step in data, compute and exposed communication, as the project's loop writes it
    (`time_split` of summary.json); None without steps."""
    if not timed:
        return None
    split: Dict[str, Any] = {f"{k}_ms": 1000 * sum(s.get(f"{k}_s") or 0 for s in timed) / len(timed)
                             for k in ("data", "compute", "comm")}
    split["step_ms"] = total = sum(split.values())
    for k in ("data", "compute", "comm"):
        split[f"{k}_frac"] = split[f"{k}_ms"] / total if total > 0 else 0.0
    split["steps"] = len(timed)
    return split


def _summary(steps_by_rank: List[List[Dict[str, Any]]], backend: Dict[str, Any], world_size: int,
             checksum: str) -> Dict[str, Any]:
    steps = steps_by_rank[0]
    timed = steps[1:]  # the first step pays for allocation and warm-up, as in the project's loop
    seconds = sum((s.get("data_s") or 0) + (s.get("compute_s") or 0) + (s.get("comm_s") or 0) for s in timed)
    samples = sum(_batch(i) for by_rank in steps_by_rank for s in by_rank[1:] for i in s.get("inputs") or [])
    split = time_split(timed)
    last = [by_rank[-1].get("loss") for by_rank in steps_by_rank if by_rank]
    losses = [v for v in last if v is not None]
    return {"backend": backend["name"], "backend_options": backend, "world_size": world_size,
            "steps": len(steps), "samples_per_s": samples / seconds if seconds > 0 else None, "train_s": seconds,
            "time_split": split, "train_loss": sum(losses) / len(losses) if losses else None,
            "val_loss": None, "val_top1": None, "val_top5": None, "weights_sha256": checksum}
