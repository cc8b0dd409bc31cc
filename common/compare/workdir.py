"""Each run of a user's scripts starts in a working directory of its own, RUN_DIR/cwd (common.rundir.names.WORKING_DIR),
so that no run reads what another wrote (a script that resumes from the newest checkpoint in its folder would resume
from an earlier run's).

The directory holds a link to each top-level entry of the folder the comparison was started in: a relative read
(`data.json`, `configs/`, `import mypkg`) reaches the user's file, and the script runs through its link there, so
its own folder is the working directory and `__file__`-relative reads reach the user's files too. A file the script
creates is created in the run's directory and stays there. What a script writes inside a linked folder, or over a
linked file, goes to the user's folder (common.compare.clashes names it). The comparison's own output (--out) is left
out, so that no run sees another's run directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Set, Tuple


@dataclass(frozen=True)
class LinkedFolder:
    """What a run's working directory links to: the entries of `source`, except that a path under it (or `source`
    itself) named in `replaced` links to the folder given there instead (the port's folder in place of the
    script's), and the paths in `left_out` (the comparison's output) are not linked. Every path is absolute."""

    source: Path
    replaced: Tuple[Tuple[Path, Path], ...] = ()
    left_out: Tuple[Path, ...] = ()

    def make(self, dest: Path) -> Path:
        """Fill `dest` (made if missing) with the links; returns it."""
        replaced = dict(self.replaced)
        _link(replaced.get(self.source, self.source), dest, replaced, set(self.left_out))
        return dest

    def roots(self) -> List[Path]:
        """The folders a run can read and write through the links."""
        found = [target for _, target in self.replaced]
        if self.source not in dict(self.replaced):
            found.insert(0, self.source)
        return found


def _under(path: Path, folder: Path) -> bool:
    return path != folder and path.is_relative_to(folder)


def _link(folder: Path, dest: Path, replaced: Dict[Path, Path], left_out: Set[Path]) -> None:
    """Link `folder`'s entries into `dest`: a folder that holds a left-out or replaced path becomes a directory of its
    own, filled the same way, so that only that path is left out or replaced."""
    dest.mkdir(parents=True, exist_ok=True)
    special = [*left_out, *replaced]
    for entry in sorted(folder.iterdir()):
        if entry in left_out:
            continue
        there = dest / entry.name
        if entry in replaced:
            there.symlink_to(replaced[entry], target_is_directory=True)
        elif entry.is_dir() and not entry.is_symlink() and any(_under(path, entry) for path in special):
            _link(entry, there, replaced, left_out)
        else:
            there.symlink_to(entry, target_is_directory=entry.is_dir())


def as_run_gives_it(script: str, here: Path) -> str:
    """The path a run gives python for `script` (named from `here`, the folder the comparison started in): the same
    relative path, which reaches it through the run's links, when it lies under `here`; else its absolute path."""
    path = Path(os.path.abspath(here / script))
    return script if not Path(script).is_absolute() and _under(path, here) else str(path)


def absolute_climbs(args: Sequence[str], here: Path) -> Tuple[str, ...]:
    """The scripts' arguments with each path that climbs out of the folder (`../data`, `--data=../data`) made
    absolute from `here`: from a run's working directory it would climb out of the run's directory instead."""
    out = []
    for arg in args:
        option, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        if value == ".." or value.startswith("../"):
            value = os.path.normpath(here / value)
        out.append(f"{option}{eq}{value}")
    return tuple(out)
