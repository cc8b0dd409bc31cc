"""The rewrite report: every change with its source line, the rule that made it and whether it can change
training; what was left unported. Typed, so that `--report-json` and `compare-backends --port` read one shape."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import List, Optional

#: exit codes of `python -m ddp_train.port`
ALL_PORTED, SOME_UNPORTED, BAD_INPUT = 0, 1, 2


@dataclass(frozen=True)
class Change:
    """One rewrite. `line` is the line of the Horovod script it replaced (1-based); `rule` the Horovod idiom
    (e.g. "hvd.DistributedOptimizer"); `text` what the port wrote instead. `changes_training` is True when the
    port can train differently from the script beyond rounding, and `effect` says how; `effect` may also name a
    difference of rounding only (then `changes_training` is False: not bitwise, within the noise floor).
    `cause` is the quantity the comparison names where the two part because of it (its cause's "quantity")."""

    line: int
    rule: str
    text: str
    changes_training: bool = False
    effect: Optional[str] = None
    cause: Optional[str] = None
    #: the file, from the ported folder's root (None: the one script ported)
    file: Optional[str] = None

    @property
    def where(self) -> str:
        """`file:line`, or `line N` in the port of one script."""
        return f"{self.file}:{self.line}" if self.file else f"line {self.line}"


@dataclass(frozen=True)
class Unported:
    """A Horovod call the port could not rewrite: left in place under a `# port:` comment (line 0: a whole file)."""

    line: int
    code: str
    reason: str
    file: Optional[str] = None

    @property
    def where(self) -> str:
        """`file:line` (a whole file: its path), or `line N` in the port of one script."""
        if self.file:
            return f"{self.file}:{self.line}" if self.line else self.file
        return f"line {self.line}"


@dataclass(frozen=True)
class Skipped:
    """A folder the port of a folder neither ported nor copied, and why."""

    path: str
    why: str


@dataclass
class PortReport:
    """Everything one port did to one script."""

    source: str
    output: Optional[str]
    changes: List[Change] = field(default_factory=list)
    unported: List[Unported] = field(default_factory=list)
    #: "dropped", "kept" (made explicit) or None when the script has no broadcast_optimizer_state
    zero_step: Optional[str] = None
    #: seconds spent parsing and rewriting (not starting Python)
    seconds: float = 0.0
    #: the port of a folder: the files it changed, how many others it copied, and the folders it skipped
    files: List[str] = field(default_factory=list)
    copied: int = 0
    skipped: List[Skipped] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 when everything was ported, 1 when something was left unported."""
        return SOME_UNPORTED if self.unported else ALL_PORTED

    @property
    def changes_training(self) -> bool:
        """True when some rewrite can make the port train differently from the script beyond rounding."""
        return any(c.changes_training for c in self.changes)

    def to_json(self) -> str:
        """The report as JSON: its fields, plus `exit_code` and `changes_training`."""
        data = asdict(self)
        data.update(exit_code=self.exit_code, changes_training=self.changes_training)
        return json.dumps(data, indent=2) + "\n"


def from_json(text: str) -> PortReport:
    """A report read back from `to_json`'s text."""
    data = json.loads(text)
    return PortReport(source=data["source"], output=data["output"],
                      changes=[Change(**c) for c in data["changes"]],
                      unported=[Unported(**u) for u in data["unported"]],
                      zero_step=data.get("zero_step"), seconds=data.get("seconds", 0.0),
                      files=list(data.get("files", [])), copied=int(data.get("copied", 0)),
                      skipped=[Skipped(**s) for s in data.get("skipped", [])])


def render(report: PortReport) -> str:
    """The report as text: a line per change (those that can change training marked), then what was left."""
    lines = [f"{report.source} -> {report.output or '(not written)'}: {_count(len(report.changes), 'change')}, "
             f"{len(report.unported)} left unported"]
    if report.files or report.skipped or report.copied:
        lines.append(f"  ported {_count(len(report.files), 'file')} ({', '.join(report.files) or 'none'}), "
                     f"copied {_count(report.copied, 'other file')}" + (
                         f"; skipped {', '.join(f'{s.path} ({s.why})' for s in report.skipped)}"
                         if report.skipped else ""))
    for change in report.changes:
        mark = "!" if change.changes_training else ("~" if change.effect else " ")
        lines.append(f"{mark} {change.where}: [{change.rule}] {change.text}")
        if change.effect:
            lines.append(f"    {'changes training' if change.changes_training else 'rounding only'}: {change.effect}")
    for item in report.unported:
        lines.append(f"? {item.where}: not ported: " + (f"{item.code}: {item.reason}" if item.line else item.reason))
    if report.changes_training:
        lines.append("! marks a rewrite that can make the port train differently; prove the port with "
                     "compare-backends --scripts SCRIPT PORT --np 2,3")
    if any(c.effect and not c.changes_training for c in report.changes):
        lines.append("~ marks a rewrite that rounds differently: not bitwise, within the noise floor")
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
