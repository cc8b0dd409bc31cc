"""Step 0: the project installed into the check's python (offline), else put on PYTHONPATH with its metadata."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..context import Context
from ..record import StepFailed, StepRecord, TimedOut
from ..settings import ROOT
from .base import Step
from .probe import probe

PIP = "pip install --no-deps --no-build-isolation -e ."
FALLBACK = "PYTHONPATH (pip could not install: see pip_error)"


class Install(Step):
    """The project importable by the check's python, with its entry points; then what that python has."""

    def run(self, ctx: Context, record: StepRecord, until: float) -> None:
        """pip install --no-deps --no-build-isolation -e . into the check's python (offline: --no-index); where pip
        cannot, the tree on PYTHONPATH with the project's metadata (entry points) written beside it."""
        cmd = [ctx.settings.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", "-e", str(ROOT), *ctx.settings.forced(record.name)]
        try:
            ctx.run(record, cmd, until)
            ctx.found.install_method = PIP
        except (StepFailed, TimedOut) as exc:
            record.result["pip_error"] = str(exc)
            site = ctx.settings.work / "site"
            write_metadata(site)
            # The metadata first: an egg-info a build left in the tree would be found before it.
            before = [ctx.env["PYTHONPATH"]] if ctx.env.get("PYTHONPATH") else []
            ctx.env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), *before])
            ctx.found.install_method = FALLBACK
            record.commands.append(f"PYTHONPATH={ctx.env['PYTHONPATH']}")
        record.result["method"] = ctx.found.install_method
        probe(ctx, record, until)

    def left_out(self, ctx: Context, record: StepRecord, until: float) -> None:
        """The project is importable already: only what the check's python has."""
        probe(ctx, record, until)


def write_metadata(site: Path) -> None:
    """The project's metadata (name, version, entry points) as a dist-info folder in `site`: on PYTHONPATH beside
    the tree, importlib.metadata finds the launchers, torchrun's loopback rendezvous and the API's entry points."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    shutil.rmtree(site, ignore_errors=True)
    info.mkdir(parents=True)
    requires = "".join(f"Requires-Dist: {r}\n" for r in project.get("dependencies", []))
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
                                   f"{requires}")
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n"
                   for group, items in groups.items())
    (info / "entry_points.txt").write_text(text)
