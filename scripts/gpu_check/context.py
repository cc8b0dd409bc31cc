"""What the steps share: the settings, the environment of their commands, the commands running, and what the
steps found that the record reports (versions, how the project was installed, the world size)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .commands import Commands
from .output import error_line
from .record import StepFailed, StepRecord, TimedOut
from .settings import Settings


@dataclass
class Findings:
    """What the install step found, for the other steps and the record."""

    versions: dict[str, Any] = field(default_factory=dict)  # the probe's, as the JSON has them
    compat: dict[str, Any] = field(default_factory=dict)
    install_method: str | None = None
    nproc: int = 1  # processes per run: the world size


@dataclass
class Context:
    """One check's shared state."""

    settings: Settings
    commands: Commands
    env: dict[str, str]  # the commands' environment (the install step may put the project on PYTHONPATH)
    found: Findings

    @classmethod
    def create(cls, settings: Settings) -> Context:
        """The context of a check with `settings`, its commands' environment this process's."""
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if settings.device == "cuda":
            env["NCCL_DEBUG"] = "VERSION"  # NCCL says its version when a communicator starts: proof it ran
        return cls(settings, Commands(), env, Findings())

    def run(self, record: StepRecord, cmd: list[str], until: float, env: dict[str, str] | None = None,
            shown: str | None = None) -> str:
        """Run `cmd` to its end or `until` (monotonic seconds); its output, appended to the step's log. A non-zero
        exit raises StepFailed with the error line, the time box TimedOut. The record keeps `shown`, else `cmd`."""
        record.commands.append(shown or " ".join(cmd))
        log = self.settings.work / "logs" / f"{record.name}.log"
        record.log = str(log.relative_to(self.settings.work))
        offset = log.stat().st_size if log.exists() else 0
        code = self.commands.wait(self.commands.start(cmd, log, env or self.env), until)
        with open(log, "rb") as f:
            f.seek(offset)
            output = f.read().decode(errors="replace")
        if code is None:
            raise TimedOut(f"stopped after its time box ({record.limit_s:.0f} s): {error_line(output) or 'no output'}")
        if code != 0:
            raise StepFailed(f"exit code {code}: {error_line(output) or 'no output'}")
        return output

