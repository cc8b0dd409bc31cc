"""`compare-backends --port TRAIN_HOROVOD.py`: port a Horovod script to DDP with the project's porter, then compare
the two as `--scripts` does, with the port's rewrite report beside the verdicts.

The porter is `python -m ddp_train.port SCRIPT -o PORT --report-json R` (a backend's tool: the comparison runs it
as a process and reads its JSON report, described in ddp_train/port/__init__.py). The port is written beside the
script as NAME_ported.py, so that it runs as the script does (its folder first on sys.path, the user's modules
beside it). Where the two part, the rewrite whose effect the comparison's cause names is quoted with the verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from .document import Block, Bullets, Paragraph, Section, Table
from .results import ParityResult

#: the porter, run as a process (common never imports a backend)
PORTER = "ddp_train.port"


@dataclass(frozen=True)
class Rewrite:
    """One change the porter made: the Horovod script's line, the rule, what it wrote, whether it can change training
    (and how), and the cause the comparison names where the two part because of it."""

    line: int
    rule: str
    text: str
    changes_training: bool = False
    effect: Optional[str] = None
    cause: Optional[str] = None


@dataclass(frozen=True)
class Ported:
    """A port: the script, where the port went, the porter's exit code (0 all ported, 1 some lines left), its
    rewrites and the lines it left with the reason."""

    source: str
    output: str
    exit_code: int
    rewrites: List[Rewrite] = field(default_factory=list)
    unported: List[Dict[str, Any]] = field(default_factory=list)
    zero_step: Optional[str] = None


def ported_name(script: Path) -> Path:
    """Where the port of `script` goes: beside it, train_horovod.py -> train_horovod_ported.py."""
    return script.with_name(f"{script.stem}_ported{script.suffix}")


def port(script: Path, report_json: Path, python: str = sys.executable, zero_step: str = "drop") -> Ported:
    """Port `script` (`zero_step` as the porter's --zero-step; ValueError with the porter's own line when it refuses
    the script)."""
    output = ported_name(script)
    report_json.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([python, "-m", PORTER, str(script), "-o", str(output), "--report-json", str(report_json),
                           "--zero-step", zero_step], capture_output=True, text=True)
    if done.returncode not in (0, 1) or not report_json.is_file():
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise ValueError(lines[-1] if lines else f"the port of {script} failed (exit code {done.returncode})")
    found = json.loads(report_json.read_text())
    return Ported(found["source"], found["output"] or str(output), int(found["exit_code"]),
                  [Rewrite(**{k: c.get(k) for k in ("line", "rule", "text", "changes_training", "effect", "cause")})
                   for c in found.get("changes", [])],
                  list(found.get("unported", [])), found.get("zero_step"))


def explaining(ported: Ported, pair: ParityResult) -> Optional[Rewrite]:
    """The rewrite that explains why a pair parts: one that can change training and whose cause is the pair's."""
    if pair.cause is None:
        return None
    return next((r for r in ported.rewrites if r.changes_training and r.cause == pair.cause.quantity), None)


#: what makes the port train as the script does, for the rewrites that have a way back: (in short, in full)
REMEDIES = {"hvd.broadcast_optimizer_state": (
    "port with --zero-step keep",
    "python -m ddp_train.port SCRIPT --zero-step keep (or compare-backends --port SCRIPT --zero-step keep) makes "
    "the port take Horovod's zero step too")}


def link(ported: Ported, pairs: List[ParityResult]) -> None:
    """Each pair that parts because of a rewrite says which, in its verdict, and what makes the port train the
    same where something does."""
    for pair in pairs:
        rewrite = explaining(ported, pair)
        if rewrite is not None:
            remedy = REMEDIES.get(rewrite.rule) if ported.zero_step != "kept" else None
            pair.explained_by = f"the port's rewrite at line {rewrite.line} ({rewrite.rule})" + (
                f"; to train the same, {remedy[0]}" if remedy else "")
            pair.verdict += f"; {pair.explained_by} explains it: {rewrite.effect or rewrite.text}" + (
                f"; {remedy[1]}" if remedy else "")


def section(ported: Ported) -> Section:
    """The report's section on the port: where it went, each rewrite, what changes training, what was left."""
    training = [r for r in ported.rewrites if r.changes_training]
    blocks: List[Block] = [Paragraph(
        f"`{ported.source}` was ported to `{ported.output}` by `python -m {PORTER}`: {len(ported.rewrites)} "
        f"rewrite{'s' if len(ported.rewrites) != 1 else ''}, {len(training)} of which can change training"
        + (f", {len(ported.unported)} line{'s' if len(ported.unported) != 1 else ''} left unported" if
           ported.unported else "") + ".")]
    if training:
        blocks.append(Bullets([f"line {r.line} ({r.rule}): {r.effect or r.text}" for r in training]))
    blocks.append(Table(["line", "rule", "what the port wrote", "can change training", "how"],
                        [[str(r.line), r.rule, r.text, "yes" if r.changes_training else "no", r.effect or ""]
                         for r in ported.rewrites]))
    if ported.unported:
        blocks.append(Paragraph("Left unported (each marked in the port with a comment):"))
        blocks.append(Bullets([f"line {u.get('line')}: `{u.get('code')}`: {u.get('reason')}"
                               for u in ported.unported]))
    return Section("The port", blocks, anchor="port")
