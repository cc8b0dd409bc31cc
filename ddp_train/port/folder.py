"""The port of a folder: every Python file that uses Horovod, or that holds a model and optimizer wrapped in another
file (port.follow), ported with what the rest of the folder tells it; one report, each change at its `file:line`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst

from .context import Options
from .follow import Handed, Skipping, WrapFact, handed, skipping
from .names import dotted
from .plan import Wrap
from .project import Folder, Resolver, import_closure, read_folder
from .report import PortReport, Unported
from .rewrite import Links, Prepared, handed_sites, port_prepared, prepare_file, refusal

#: methods that return the model they are called on: `Net().to(device)` builds a Net
SAME_MODEL = ("to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train", "eval")


@dataclass
class FolderPorted:
    """A folder's port: the new text of each file the port changed (by path from the root), and the report."""

    folder: Folder
    texts: Dict[str, str] = field(default_factory=dict)
    report: PortReport = field(default_factory=lambda: PortReport(source="", output=None))


def _factory(prepared: Prepared, wrap: Wrap) -> Optional[str]:
    """The callable that built the wrapped model, as the file names it (`Net`, `models.build`)."""
    assert prepared.plan is not None
    if wrap.model is None:
        return None
    assigned = prepared.plan.assigned(wrap.model, wrap.placed.scope, wrap.placed.line)
    value = assigned.value if assigned is not None else None
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and \
            value.func.attr.value in SAME_MODEL and isinstance(value.func.value, cst.Call):
        value = value.func.value
    return dotted(value.func) if isinstance(value, cst.Call) else None


def _facts(path: str, prepared: Prepared) -> List[WrapFact]:
    if prepared.plan is None:
        return []
    facts = []
    for wrap in prepared.plan.wraps:
        passes = wrap.options.get("backward_passes_per_step")
        scope = wrap.placed.scope
        facts.append(WrapFact(path, wrap.placed.line, wrap.target, wrap.model,
                              cst.Module(body=[]).code_for_node(passes) if passes is not None else None,
                              scope.name.value if isinstance(scope, cst.FunctionDef) else None,
                              _factory(prepared, wrap)))
    return facts


def links_of(folder: Folder, given: Optional[Dict[str, Prepared]] = None
             ) -> Tuple[Dict[str, Prepared], Dict[str, Links]]:
    """Every file of the folder to port, prepared (those `given` as they are), with its links to the rest of the
    folder."""
    resolver = Resolver(folder)
    files = {f.path: f for f in folder.files}
    prepared = dict(given or {})
    prepared.update({path: prepare_file(f) for path, f in files.items() if path not in prepared and f.uses_horovod})
    facts = [fact for path, p in prepared.items() for fact in _facts(path, p)]
    held: List[Handed] = handed(facts, files, resolver)
    handed_by: Dict[str, List[Handed]] = {}
    synced: Dict[str, Dict[str, str]] = {}
    for item in held:
        if item.path not in prepared or prepared[item.path].plan is None:
            prepared[item.path] = prepare_file(files[item.path], parse_always=True)
        handed_by.setdefault(item.path, []).append(item)
        sites = handed_sites(prepared[item.path], item)
        for fact in facts:
            if sites and fact.origin == item.origin:
                synced.setdefault(fact.path, {})[fact.optimizer] = f"{item.path}:{sites[0].placed.line}"
    skips: Dict[str, List[Tuple[str, Skipping]]] = {}
    for fact in facts:
        found = skipping(files[fact.path], fact.model_factory, resolver)
        if found is not None and fact.model is not None:
            skips.setdefault(fact.path, []).append((fact.model, found))
    links = {path: Links(tuple(handed_by.get(path, ())), tuple(synced.get(path, {}).items()),
                         tuple(skips.get(path, ()))) for path in prepared}
    return prepared, links


def port_folder(root: Path, options: Optional[Options] = None, leave_out: Sequence[Path] = (),
                output: Optional[str] = None) -> FolderPorted:
    """Port every file of the folder under `root` that has something to port (PortError naming the file and line
    of one that cannot be parsed); `leave_out`: folders not read (the port's own output)."""
    started = time.perf_counter()
    folder = read_folder(root, leave_out)
    result = FolderPorted(folder, report=PortReport(source=str(root), output=output))
    report = result.report
    for file in folder.files:
        if file.may_use_horovod and file.tree is None:
            why = refusal(file.path, file.text, file.error)
            report.unported.append(Unported(0, file.path, f"{why}; the file is copied as it is", file.path))
    prepared, links = links_of(folder)
    for path in sorted(prepared):
        ported = port_prepared(prepared[path], path, options, links[path])
        if ported.code != prepared[path].text:
            result.texts[path] = ported.code
            report.files.append(path)
        report.changes += [replace(c, file=path) for c in ported.report.changes]
        report.unported += [replace(u, file=path) for u in ported.report.unported]
        report.zero_step = report.zero_step or ported.report.zero_step
    report.skipped = list(folder.skipped)
    report.seconds = time.perf_counter() - started
    return result


def port_script(script: Path, text: str, options: Optional[Options] = None
                ) -> Tuple[Optional[str], PortReport, List[Unported]]:
    """The port of one script with what the modules of its folder that it imports tell it (a loop in another
    module, a model class there): (its new text, None where nothing changed; its report; each of those modules that
    needs the port too, as an Unported naming it)."""
    folder = import_closure(script, text)
    name = script.name
    own = prepare_file(folder.files[0], str(script))  # the script's own errors name it as given
    prepared, links = links_of(folder, {name: own})
    ported = port_prepared(prepared[name], None, options, links.get(name, Links()))
    left = []
    for path in sorted(prepared):
        if path != name and port_prepared(prepared[path], path, options, links[path]).code != prepared[path].text:
            left.append(Unported(0, path, "a module of this folder that the script imports, with Horovod or the "
                                 "training loop in it, left as it is", path))
    return ported.code if ported.code != prepared[name].text else None, ported.report, left
