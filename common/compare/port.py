"""`compare-backends --port TRAIN_HOROVOD.py`: port a Horovod script's folder to DDP with the project's porter, then
compare the script with its port as `--scripts` does, with the port's rewrite report beside the verdicts.

The porter is `python -m ddp_train.port FOLDER -o OUT/port --report-json OUT/port.json` (a backend's tool: the
comparison runs it as a process and reads its JSON report, described in ddp_train/port/__init__.py): every Python
file of the script's folder that uses Horovod is ported, the rest of the folder copied, into OUT/port, so that the
port runs as the script does (its own modules beside it, its data and configs where it reads them). The script's
runs start in working directories linked to the folder the comparison started in, the port's in working
directories linked to OUT/port (common.compare.workdir). Where the two part, the rewrite whose effect the
comparison's cause names is quoted with the verdict.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .document import Block, Bullets, Paragraph, Section, Table
from .matrix import Scripts
from .results import ParityResult
from .scripts import backend_of, linked
from .workdir import LinkedFolder

#: the porter, run as a process (common never imports a backend)
PORTER = "ddp_train.port"
#: where in --out the port goes, and its report
PORT_DIR = "port"
PORT_REPORT = "port.json"


@dataclass(frozen=True)
class Rewrite:
    """One change the porter made: the Horovod file's line, the rule, what it wrote, whether it can change training
    (and how), the cause the comparison names where the two part because of it, and the file (its path in the
    folder; None in a report of one script)."""

    line: int
    rule: str
    text: str
    changes_training: bool = False
    effect: Optional[str] = None
    cause: Optional[str] = None
    file: Optional[str] = None


@dataclass(frozen=True)
class Ported:
    """A port: the folder ported (`source`), where the port went (`output`, OUT/port), the script and its port (the
    script's path in the folder under `output`), the porter's exit code (0 all ported, 1 some lines left), its
    rewrites, the lines it left with the reason, the files it ported and what it skipped."""

    source: str
    output: str
    script: str
    script_port: str
    exit_code: int
    rewrites: List[Rewrite] = field(default_factory=list)
    unported: List[Dict[str, Any]] = field(default_factory=list)
    zero_step: Optional[str] = None
    files: List[str] = field(default_factory=list)
    skipped: List[Dict[str, Any]] = field(default_factory=list)


def read_report(found: Dict[str, Any], folder: Path, output: Path, script: Path) -> Ported:
    """The porter's JSON report (`file` in a change or an unported line is optional: a report of one script has
    none)."""
    keys = ("line", "rule", "text", "changes_training", "effect", "cause", "file")
    return Ported(str(folder), str(output), str(script), str(output / script.relative_to(folder)),
                  int(found["exit_code"]), [Rewrite(**{k: c.get(k) for k in keys}) for c in found.get("changes", [])],
                  list(found.get("unported", [])), found.get("zero_step"), list(found.get("files", [])),
                  list(found.get("skipped", [])))


def port(script: Path, out: Path, python: str = sys.executable, zero_step: str = "drop") -> Ported:
    """Port `script`'s folder into OUT/port (`zero_step` as the porter's --zero-step; ValueError with the porter's
    own line when it refuses the folder)."""
    script = Path(os.path.abspath(script))
    folder, output, report_json = script.parent, out.resolve() / PORT_DIR, out / PORT_REPORT
    if output.exists():  # a comparison run again into the same --out: the porter writes a new folder
        shutil.rmtree(output)
    report_json.parent.mkdir(parents=True, exist_ok=True)
    report_json.unlink(missing_ok=True)
    done = subprocess.run([python, "-m", PORTER, str(folder), "-o", str(output), "--report-json", str(report_json),
                           "--zero-step", zero_step], capture_output=True, text=True)
    if done.returncode not in (0, 1) or not report_json.is_file():
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise ValueError(lines[-1] if lines else f"the port of {folder} failed (exit code {done.returncode})")
    return read_report(json.loads(report_json.read_text()), folder, output, script)


def program(ported: Ported, script: str, args: Sequence[str], max_steps: Optional[int], *, here: Path,
            out: Path) -> Scripts:
    """The script (`script`, as given from `here`) and its port, to compare as --scripts does: the script's runs in
    working directories linked to `here`, the port's linked to `here` with the script's folder replaced by the port's
    (where the script's folder is `here`: linked to OUT/port); ValueError where the port still imports horovod."""
    port_path = Path(ported.script_port)
    if backend_of(port_path) == "horovod":
        raise ValueError(f"--port {script}: its port {port_path} still imports horovod (see {ported.output} and the "
                         "porter's report); port the rest by hand and compare with --scripts")
    here, folder, output = here.resolve(), Path(ported.source).resolve(), Path(ported.output)
    if folder == here or folder.is_relative_to(here):
        ported_folder = LinkedFolder(here, replaced=((folder, output),), left_out=(out.resolve(),))
        return linked((("horovod", script), ("ddp", script)), args, max_steps, here, out, {"ddp": ported_folder})
    return linked((("horovod", script), ("ddp", str(port_path))), args, max_steps, here, out)


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
            elsewhere = f" of {rewrite.file}" if rewrite.file and rewrite.file != script_name(ported) else ""
            pair.explained_by = f"the port's rewrite at line {rewrite.line}{elsewhere} ({rewrite.rule})" + (
                f"; to train the same, {remedy[0]}" if remedy else "")
            pair.verdict += f"; {pair.explained_by} explains it: {rewrite.effect or rewrite.text}" + (
                f"; {remedy[1]}" if remedy else "")


def script_name(ported: Ported) -> str:
    """The script's path in its folder, as the porter's report names files."""
    return Path(ported.script).relative_to(ported.source).as_posix()


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def section(ported: Ported) -> Section:
    """The report's section on the port: where it went, the files it ported, each rewrite (`file:line`), what changes
    training, what was left and what was skipped."""
    training = [r for r in ported.rewrites if r.changes_training]
    files = f" ({_plural(len(ported.files), 'file')} ported: {', '.join(f'`{f}`' for f in ported.files)})" \
        if ported.files else ""
    blocks: List[Block] = [Paragraph(
        f"`{ported.source}` was ported to `{ported.output}` by `python -m {PORTER}`{files}, and "
        f"`{script_name(ported)}` ran as `{ported.script_port}`: {_plural(len(ported.rewrites), 'rewrite')}, "
        f"{len(training)} of which can change training"
        + (f", {_plural(len(ported.unported), 'line')} left unported" if ported.unported else "")
        + ".")]
    if training:
        blocks.append(Bullets([f"{r.file or script_name(ported)}:{r.line} ({r.rule}): {r.effect or r.text}"
                               for r in training]))
    blocks.append(Table(["file:line", "rule", "what the port wrote", "can change training", "how"],
                        [[f"{r.file or script_name(ported)}:{r.line}", r.rule, r.text,
                          "yes" if r.changes_training else "no", r.effect or ""] for r in ported.rewrites]))
    if ported.unported:
        blocks.append(Paragraph("Left unported (each marked in the port with a comment):"))
        blocks.append(Bullets([f"{_where(u, ported)}: `{u.get('code')}`: {u.get('reason')}" for u in ported.unported]))
    if ported.skipped:
        blocks.append(Paragraph("Not copied: " + "; ".join(f"`{s.get('path')}` ({s.get('why')})"
                                                          for s in ported.skipped) + "."))
    return Section("The port", blocks, anchor="port")


def _where(unported: Dict[str, Any], ported: Ported) -> str:
    return f"{unported.get('file') or script_name(ported)}:{unported.get('line')}"
