"""Read run directories (the contract of the training side) and decide whether they compare."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from .names import CONFIG_FILE, LAUNCH_RECORD, METRICS_FILE, MODEL_FILE, RUN_FILES, SUMMARY_FILE

#: settings that must be equal for runs to be compared at all
MUST_MATCH = ("model", "dataset", "seed", "batch_size")
#: the label variant of a run whose initial weights were disturbed (--perturb-ulp), with its pattern: ddp+perturbed2
DISTURBED = "perturbed"
#: settings that never change what is learned, so they are not reported as differences
IGNORED = ("run_dir", "log_every", "eval_every", "workers", "device")
#: param-group entries that are no setting of a step: the learning rate (compared on its own, step by step), the
#: scheduler's record of it, and how the step is computed (the same arithmetic, other rounding)
NOT_OPTIMIZER_SETTINGS = ("lr", "initial_lr", "foreach", "fused", "capturable", "differentiable",
                          "decoupled_weight_decay")
#: settings a run's label carries (ddp+perturbed2, horovod-gloo+predivide): they do not set runs of one label apart
LABELLED = ("perturb_ulp", "perturb_pattern", "predivide", "deterministic")


#: how a run's name is spelled: label (backend, then +variants), settings tag, @world size, #repeat (1-based)
NAME = re.compile(r"^(?P<backend>[^+\[@#]+)(?P<variants>(?:\+[^+\[@#]+)*)(?P<tag>\[[^\]]*\])?@(?P<world>\d+)"
                  r"(?:#(?P<repeat>\d+))?$")


@dataclass(frozen=True)
class RunId:
    """Who a run is among the runs compared: its backend (ddp, horovod-gloo, horovod-mpi, ...), the variants that
    change how it runs (predivide, deterministic; perturbed2, a disturbed run of the noise floor), the settings
    that set it apart from other runs of its backend (`tag`, "[lr=0.0012]"), its world size and which repeat it
    is (0-based). Spelled `label` (ddp+perturbed2), `key` (label, tag and world size: runs of one key are
    repeats) and `name` (ddp+perturbed2[lr=0.0012]@3#1); `parse` reads a key or a name back."""

    backend: str
    variants: Tuple[str, ...] = ()
    tag: str = ""
    world_size: int = 1
    repeat: int = 0

    @property
    def label(self) -> str:
        return self.backend + "".join(f"+{v}" for v in self.variants)

    @property
    def key(self) -> str:
        return f"{self.label}{self.tag}@{self.world_size}"

    @property
    def name(self) -> str:
        return f"{self.key}#{self.repeat + 1}"

    @property
    def is_variant(self) -> bool:
        """A run of an explaining variant or of the noise floor: no backend of its own."""
        return bool(self.variants)

    @property
    def is_disturbed(self) -> bool:
        """A run of the noise floor (--perturb-ulp)."""
        return any(v.startswith(DISTURBED) for v in self.variants)

    @classmethod
    def parse(cls, text: str) -> "RunId":
        """A run's name or key; ValueError when it is neither."""
        found = NAME.match(text)
        if not found:
            raise ValueError(f"{text!r} is not a run's name (label@world#repeat)")
        variants = tuple(v for v in found["variants"].split("+") if v)
        return cls(found["backend"], variants, found["tag"] or "", int(found["world"]),
                   int(found["repeat"]) - 1 if found["repeat"] else 0)


def run_name(label: str, world_size: int, repeat: int) -> str:
    """How the comparison names a run: label@world size#repeat (1-based), e.g. ddp@2#1."""
    return replace(RunId.parse(f"{label}@{world_size}"), repeat=repeat).name


@dataclass
class Run:
    """Everything the comparison needs from one run directory."""

    path: Path
    config: Dict
    summary: Dict
    events: List[Dict]
    repeat: int = 0
    launch: Dict = field(default_factory=dict)
    #: the settings that set this run apart from others of its backend and world size, "[lr=0.0012]" (set by
    #: number_repeats; empty when there are none)
    tag: str = ""
    _weights: Optional[Dict[str, torch.Tensor]] = field(default=None, repr=False)

    @property
    def settings(self) -> Dict:
        return self.config["config"]

    @property
    def world_size(self) -> int:
        return int(self.summary["world_size"])

    @property
    def identity(self) -> RunId:
        """Backend and, for Horovod, its controller (ddp, horovod-gloo, horovod-mpi), the variants that change how
        it sums (predivide, deterministic) and, for a run whose initial weights were disturbed (--perturb-ulp),
        perturbed and its --perturb-pattern; the settings tag; world size and repeat."""
        backend = self.config["backend"]
        name = backend.get("name", "unknown")
        if name == "horovod" and backend.get("controller"):
            name = f"horovod-{backend['controller']}"
        variants = []
        if backend.get("predivide") and name != "ddp":  # DDP divides before the sum either way
            variants.append("predivide")
        if backend.get("deterministic"):
            variants.append("deterministic")
        if self.settings.get("perturb_ulp"):
            variants.append(f"{DISTURBED}{self.settings.get('perturb_pattern', 1)}")
        return RunId(name, tuple(variants), self.tag, self.world_size, self.repeat)

    @property
    def label(self) -> str:
        """ddp, horovod-gloo, horovod-gloo+predivide, ddp+perturbed1 (RunId.label)."""
        return self.identity.label

    @property
    def key(self) -> str:
        """label, settings tag and world size, e.g. ddp@2 or ddp[lr=0.0012]@2: runs of one key are repeats."""
        return self.identity.key

    @property
    def name(self) -> str:
        return self.identity.name

    def step_losses(self) -> Dict[int, float]:
        """Rank 0's loss at each logged step."""
        return {e["step"]: e["loss"] for e in self.events if e["event"] == "step"}

    def step_states(self) -> Dict[int, Dict]:
        """Per logged step, what describes the weights its forward pass saw: rank 0's loss, the step's learning
        rate, the weights' fingerprint (`wnorm`, logged after the step before, or at the start) when the
        run recorded one, and the optimizer's other settings the step applied (`optimizer`: a run of the probe
        records every param group's, a run of the loop has its configured ones)."""
        logged = {e["step"]: e for e in self.events if e["event"] == "step"}
        starts = {e["step"]: e for e in self.events if e["event"] == "start"}
        configured = self.optimizer_settings()
        out = {}
        for step, event in logged.items():
            before = logged.get(step - 1) or starts.get(step - 1) or {}
            groups = event.get("groups")
            settings = configured if groups is None else [
                {k: v for k, v in group.items() if k not in NOT_OPTIMIZER_SETTINGS} for group in groups]
            out[step] = {"loss": event.get("loss"), "lr": event.get("lr"), "wnorm": before.get("wnorm"),
                         "optimizer": settings}
        return out

    def optimizer_settings(self) -> List[Dict[str, Any]]:
        """The settings of the loop's optimizer but its learning rate (a run of the probe records its own per step):
        which optimizer, its weight decay and, for SGD, its momentum; [] for a run that records none."""
        settings = self.settings
        if "optimizer" not in settings:
            return []
        found = {"optimizer": settings["optimizer"], "weight_decay": settings.get("weight_decay")}
        if settings["optimizer"] == "sgd":
            found["momentum"] = settings.get("momentum")
        return [found]

    def epochs(self) -> List[Dict]:
        """One event per epoch, in order; for an epoch cut short and resumed, its completed record."""
        last: Dict[int, Dict] = {}
        for e in self.events:
            if e["event"] == "epoch":
                last[e["epoch"]] = e
        return [last[k] for k in sorted(last)]

    def buffer_names(self) -> set:
        """Which entries of the weights are buffers, not parameters (config.json's record; for a run that
        has none, the usual names of BatchNorm's statistics)."""
        recorded = self.config.get("buffers")
        if recorded is not None:
            return set(recorded)
        return {k for k in self.weights() if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}

    def weights(self) -> Dict[str, torch.Tensor]:
        """The final state_dict (weights_only: nothing in the file is executed), read once."""
        if self._weights is None:
            self._weights = torch.load(self.path / MODEL_FILE, map_location="cpu", weights_only=True)
        return self._weights


def read_run(path: Path) -> Run:
    """Load a run directory; ValueError naming the file when it is not a complete run."""
    path = Path(path)
    missing = [n for n in RUN_FILES if not (path / n).is_file()]
    if missing:
        raise ValueError(f"{path} is not a complete run directory: missing {', '.join(missing)}")
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
        summary = json.loads((path / SUMMARY_FILE).read_text())
        events = read_events(path)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: unreadable JSON ({exc})") from None
    launch = {}
    if (path / LAUNCH_RECORD).is_file():
        launch = json.loads((path / LAUNCH_RECORD).read_text())
    return Run(path, config, summary, events, launch=launch)


def read_events(path) -> List[Dict]:
    """Every event of a finished run's metrics.jsonl, in order."""
    return [json.loads(line) for line in (Path(path) / METRICS_FILE).read_text().splitlines() if line.strip()]


def events_so_far(path) -> List[Dict[str, Any]]:
    """The events in a run directory's metrics.jsonl now, while the run may still be writing it (a line
    being written is left out); [] before the file exists."""
    file = os.path.join(path, METRICS_FILE)
    if not os.path.exists(file):
        return []
    events = []
    with open(file) as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # the line being written
    return events


def read_files(path) -> Dict:
    """A finished run's files as plain data: {"config", "summary", "events", "model"} (the model's state_dict
    loaded weights_only), for the tests and the benchmarks that assert on what a run wrote."""
    path = Path(path)
    return {
        "config": json.loads((path / CONFIG_FILE).read_text()),
        "summary": json.loads((path / SUMMARY_FILE).read_text()),
        "events": read_events(path),
        "model": torch.load(path / MODEL_FILE, weights_only=True),
    }


def learned_settings(run: Run) -> Dict:
    """The settings that can change what a run learns, less those its label already carries."""
    return {k: v for k, v in run.settings.items() if k not in IGNORED and k not in LABELLED}


def number_repeats(runs: List[Run]) -> None:
    """Runs with the same backend, world size and settings are repeats: number them 0, 1, ... Runs of one backend
    and world size whose settings differ are never repeats: each is tagged with the settings that set it apart
    ("[lr=0.0012]")."""
    groups: Dict[str, List[Run]] = {}
    for run in runs:
        run.tag = ""
        groups.setdefault(run.key, []).append(run)
    for group in groups.values():
        settings = [learned_settings(run) for run in group]
        keys = sorted({k for s in settings for k in s})
        differing = [k for k in keys if len({json.dumps(s.get(k), sort_keys=True) for s in settings}) > 1]
        if differing:
            for run, s in zip(group, settings, strict=True):
                run.tag = "[" + ",".join(f"{k}={s.get(k)}" for k in differing) + "]"
    seen: Dict[str, int] = {}
    for run in runs:
        run.repeat = seen.get(run.key, 0)
        seen[run.key] = run.repeat + 1


def setting_differences(runs: List[Run]) -> Dict[str, Dict[str, object]]:
    """Every training setting whose value is not the same in all runs: {setting: {run: value}}."""
    keys = sorted({k for run in runs for k in run.settings} - set(IGNORED))
    out = {}
    for key in keys:
        values = {run.name: run.settings.get(key) for run in runs}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            out[key] = values
    return out


def factory_differences(runs: List[Run]) -> List[str]:
    """One reason per model or dataset factory (given by import path) whose source differs between runs:
    the same name over edited code is not the same model."""
    reasons = []
    for kind in ("model", "dataset"):
        found = {run.name: (run.config.get("factories") or {}).get(kind) for run in runs}
        sources = {json.dumps(record and [record.get("spec"), record.get("sha256")]) for record in found.values()}
        if len(sources) > 1:
            shown = ", ".join(f"{name}={_factory_text(record)}" for name, record in found.items())
            reasons.append(f"{kind} factory differs ({shown})")
    return reasons


def _factory_text(record) -> str:
    if not record:
        return "built-in"
    digest = (record.get("sha256") or "no source")[:12]
    return f"{record.get('spec')} {record.get('source')} sha256 {digest}"


def check_comparable(runs: List[Run]) -> List[str]:
    """Reasons these runs cannot be compared (empty when they can): a must-match setting that
    differs, or runs of one world size that took different numbers of steps."""
    reasons = []
    diffs = setting_differences(runs)
    for key in MUST_MATCH:
        if key in diffs:
            shown = ", ".join(f"{name}={value}" for name, value in diffs[key].items())
            reasons.append(f"{key} differs ({shown})")
    reasons += factory_differences(runs)
    by_world: Dict[int, Dict[str, Optional[int]]] = {}
    for run in runs:
        by_world.setdefault(run.world_size, {})[run.name] = run.summary.get("steps")
    for world, steps in sorted(by_world.items()):
        if len(set(steps.values())) > 1:
            shown = ", ".join(f"{name}={value}" for name, value in steps.items())
            reasons.append(f"steps differ at world size {world} ({shown})")
    return reasons

