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


@dataclass(frozen=True)
class Unported:
    """A Horovod call the port could not rewrite: left in place under a `# port:` comment."""

    line: int
    code: str
    reason: str


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
                      zero_step=data.get("zero_step"), seconds=data.get("seconds", 0.0))


def render(report: PortReport) -> str:
    """The report as text: a line per change (those that can change training marked), then what was left."""
    lines = [f"{report.source} -> {report.output or '(not written)'}: {len(report.changes)} change"
             f"{'' if len(report.changes) == 1 else 's'}, {len(report.unported)} left unported"]
    for change in report.changes:
        mark = "!" if change.changes_training else ("~" if change.effect else " ")
        lines.append(f"{mark} line {change.line}: [{change.rule}] {change.text}")
        if change.effect:
            lines.append(f"    {'changes training' if change.changes_training else 'rounding only'}: {change.effect}")
    for item in report.unported:
        lines.append(f"? line {item.line}: not ported: {item.code}: {item.reason}")
    if report.changes_training:
        lines.append("! marks a rewrite that can make the port train differently; prove the port with "
                     "compare-backends --scripts SCRIPT PORT --np 2,3")
    if any(c.effect and not c.changes_training for c in report.changes):
        lines.append("~ marks a rewrite that rounds differently: not bitwise, within the noise floor")
    return "\n".join(lines)
