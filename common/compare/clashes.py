"""What the runs of one comparison share on disk, and a run that started with what an earlier run wrote there.

Each run of a user's scripts has a working directory of its own (common.compare.workdir), yet two places stay
shared: an absolute path in the scripts' arguments (`--checkpoint /tmp/ck.pt` names one file for every run), and the
user's folder itself, which a script writes into through a link (a file in an existing subfolder, or over an existing
file). Between runs the comparison notes what each run created or changed in those places (the files' sizes and
modification times, found without following links). A run that starts with a path an earlier run wrote is a clash:
it may resume from, or read, the earlier run's state. The clash is named in one line, with the fix: `{run_dir}` in
the scripts' arguments gives each run its own path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from ..launch.userscript import RUN_DIR_PLACEHOLDER

#: at most this many entries are looked at under each watched place between two runs (a dataset's folder can hold
#: millions; what a run writes is near the top)
MAX_ENTRIES = 20000
#: folders whose changes are no run's output: python's bytecode caches, version control
IGNORED = frozenset({"__pycache__", ".git"})
#: absolute paths that name no file a run writes for a later one
SYSTEM = ("/dev", "/proc", "/sys")

Stamp = Tuple[int, int]


def named_paths(args: Sequence[str]) -> Dict[Path, str]:
    """The absolute paths the scripts' arguments name, each with the words that name it (`--checkpoint /tmp/ck.pt`,
    `--checkpoint=/tmp/ck.pt`); those with {run_dir} are each run's own, and system paths are left out."""
    found: Dict[Path, str] = {}
    for index, arg in enumerate(args):
        if RUN_DIR_PLACEHOLDER in arg:
            continue
        option, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        if not value.startswith("/") or value == "/" or any(value == s or value.startswith(s + "/") for s in SYSTEM):
            continue
        before = args[index - 1] if index and not eq else ""
        takes_value = before.startswith("-") and "=" not in before
        shown = f"{option}{eq}{value}" if eq else (f"{before} {value}" if takes_value else value)
        found[Path(os.path.normpath(value))] = shown
    return found


def with_run_dir(shown: str, path: Path) -> str:
    """The argument `shown` (naming `path`) with each run's own path: `--checkpoint {run_dir}/ck.pt`."""
    own = f"{RUN_DIR_PLACEHOLDER}/{path.name}"
    value = shown.rpartition(" ")[2].rpartition("=")[2]
    return shown[:len(shown) - len(value)] + own


def stamps(root: Path, left_out: Sequence[Path], limit: int = MAX_ENTRIES) -> Dict[Path, Stamp]:
    """(size, modification time in ns) of each file under `root` (or of `root`, a file), links not followed, IGNORED
    folders and `left_out` skipped, at most `limit` entries looked at."""
    found: Dict[Path, Stamp] = {}
    for path, stat in _walk(root, set(left_out), limit):
        found[path] = (stat.st_size, stat.st_mtime_ns)
    return found


def _walk(root: Path, left_out: Set[Path], limit: int) -> Iterator[Tuple[Path, os.stat_result]]:
    try:
        stat = root.lstat()
    except OSError:
        return
    if not root.is_dir() or root.is_symlink():
        yield root, stat
        return
    folders, seen = [root], 0
    while folders and seen < limit:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            path = Path(entry.path)
            if entry.name in IGNORED or path in left_out:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(path)
                else:
                    yield path, entry.stat(follow_symlinks=False)
            except OSError:
                continue


@dataclass(frozen=True)
class Clash:
    """A run (`run`) that started with `path`, which `earlier` created or changed before it; `others` more such
    paths. `named`: the argument that gives every run that path, and `own`, the same with each run's own path; or
    `folder`, the user's folder the path lies in."""

    run: str
    earlier: str
    path: Path
    others: int = 0
    named: Optional[str] = None
    own: Optional[str] = None
    folder: Optional[Path] = None

    def line(self) -> str:
        """The clash in one line, with the fix."""
        more = f" (and {self.others} more path{'s' if self.others > 1 else ''} it wrote)" if self.others else ""
        said = f"{self.run} started with {self.path}, which {self.earlier} wrote before it{more}"
        if self.named is not None:
            return (f"{said}: every run is given `{self.named}`; give each run its own with {RUN_DIR_PLACEHOLDER}, "
                    f"which the comparison fills with the run's directory: `{self.own}`")
        return (f"{said}, in {self.folder} through the link in its working directory: have the script write to a new "
                f"path (a new file stays in each run's working directory), or give it one with {RUN_DIR_PLACEHOLDER} "
                "in the scripts' arguments")


@dataclass
class Watch:
    """The places the runs of a comparison share: `folders` (the user's, linked into each run's working directory),
    the absolute paths the arguments name (`named`: path -> the argument), and `left_out` (the comparison's output).
    Call `before` as a run starts and `after` when it ended."""

    folders: List[Path]
    named: Dict[Path, str]
    left_out: List[Path]
    #: path -> the run that last created or changed it
    written: Dict[Path, str] = field(default_factory=dict)
    #: what each run wrote into the user's folders: (run, path), in order
    into_folders: List[Tuple[str, Path]] = field(default_factory=list)
    _last: Optional[Dict[Path, Stamp]] = None

    def _now(self) -> Dict[Path, Stamp]:
        found: Dict[Path, Stamp] = {}
        for root in [*self.folders, *self.named]:
            found.update(stamps(root, self.left_out))
        return found

    def before(self, run: str) -> Optional[Clash]:
        """A path `run` starts with that an earlier run wrote, or None."""
        self._last = now = self._now()
        clashing = sorted((path for path in now if path in self.written), key=lambda p: (self._named_of(p) is None, p))
        if not clashing:
            return None
        first = clashing[0]
        named = self._named_of(first)
        if named is not None:
            return Clash(run, self.written[first], first, len(clashing) - 1, self.named[named],
                         with_run_dir(self.named[named], named))
        return Clash(run, self.written[first], first, len(clashing) - 1, folder=self._folder_of(first))

    def after(self, run: str) -> None:
        """Note what `run` created or changed."""
        before = self._last or {}
        now = self._now()
        for path, stamp in sorted(now.items()):
            if before.get(path) != stamp:
                self.written[path] = run
                if self._named_of(path) is None and self._folder_of(path) is not None:
                    self.into_folders.append((run, path))
        self._last = now

    def _named_of(self, path: Path) -> Optional[Path]:
        """The named path `path` is, or lies under."""
        return next((named for named in self.named if path.is_relative_to(named)), None)

    def _folder_of(self, path: Path) -> Optional[Path]:
        return next((folder for folder in self.folders if path.is_relative_to(folder)), None)

    def notes(self) -> List[str]:
        """One line per run that wrote into the user's folders through its links: what it wrote (the folder is not left
        as it was)."""
        by_run: Dict[str, List[Path]] = {}
        for run, path in self.into_folders:
            by_run.setdefault(run, []).append(path)
        return [f"{run} wrote {paths[0]}" + (f" and {len(paths) - 1} more file{'s' if len(paths) > 2 else ''}"
                                            if len(paths) > 1 else "")
                + " in your folder, through a link in its working directory (files it creates beside the links stay "
                  "in its own)" for run, paths in by_run.items()]
