"""Why a launched run failed, in one line, from its launcher's output (launch.log): the first failing rank's own
exception, not the launcher's wrapper around it.

Each launcher shows a rank's output its own way: torchrun prefixes a rank's traceback with `[rankN]:` once the
process group is up (else the lines come bare) and names the first failing rank under "Root Cause"; horovodrun
--gloo prefixes `[N]<stderr>:` and says "Terminating remaining workers after failure of Process N"; Open MPI
(horovodrun --mpi) prefixes `[J,N]<stderr>:` and names the first "Process name: [[J,1],N]"; a run across hosts
prefixes each line with `[host] `. Then each launcher raises or prints an error of its own (ChildFailedError,
"Horovod detected that one or more processes exited with non-zero status", mpirun's box), which says only that a
rank failed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

#: a run across hosts: each line prefixed with its host (common.launch.remote.HostsJob)
HOST = re.compile(r"^\[[^\]\s]+\] ")
#: a rank's line: torch's own traceback prefix, horovodrun --gloo's, Open MPI's tagged output
RANK = (re.compile(r"^\[rank(\d+)\]: ?"), re.compile(r"^\[(\d+)\]<std(?:out|err)>:"),
        re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:"))
#: how each launcher names the first rank that failed
FIRST_FAILED = (re.compile(r"Terminating remaining workers after failure of Process (\d+)"),
                re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]"))
ROOT_CAUSE = "Root Cause (first observed failure):"
TRACEBACK = "Traceback (most recent call last):"
#: the line that ends a traceback: the exception's name, then its message
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(:|$)")
#: the line between two tracebacks of one chain (the later one is the exception that ended the rank)
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
#: a traceback that starts in one of these is the launcher's own
LAUNCHER_FRAMES = re.compile(r'File "[^"]*(/bin/(torchrun|horovodrun|mpirun)|/torch/distributed/run\.py'
                             r'|/horovod/runner/)')
#: the launchers' own exceptions, which only say that a rank failed
WRAPPERS = ("ChildFailedError", "Horovod detected that one or more processes exited with non-zero status")
#: the project's one-line errors (common.errors.print_error)
OURS = ": error: "


@dataclass(frozen=True)
class Raised:
    """An exception a process printed: the rank whose output it was in (None where the launcher does not say), its
    line (`ValueError: ...`), the line's place in the output, and whether the launcher raised it."""

    rank: Optional[int]
    text: str
    index: int
    launcher: bool = False


def split(line: str) -> Tuple[Optional[int], str]:
    """(the rank a line of output is from, or None; the line without the launcher's prefixes)."""
    line = HOST.sub("", line, count=1)
    for pattern in RANK:
        found = pattern.match(line)
        if found:
            return int(found.group(1)), line[found.end():]
    return None, line


def first_failed(lines: Sequence[str]) -> Optional[int]:
    """The rank the launcher names as the first that failed, or None."""
    for index, line in enumerate(lines):
        text = split(line)[1]
        if ROOT_CAUSE in text:
            for after in lines[index + 1:index + 8]:
                found = re.match(r"^\s*rank\s*:\s*(\d+)", split(after)[1])
                if found:
                    return int(found.group(1))
        for pattern in FIRST_FAILED:
            found = pattern.search(text)
            if found:
                return int(found.group(1))
    return None


def raised(lines: Sequence[str]) -> List[Raised]:
    """Every exception that ended a traceback, in the order printed, per rank (the last of a chain only)."""
    found: List[Raised] = []
    open_at: Dict[Optional[int], Optional[List[str]]] = {}
    for index, line in enumerate(lines):
        rank, text = split(line.rstrip("\n"))
        frames = open_at.get(rank)
        if text.strip() == TRACEBACK:
            open_at[rank] = []
        elif frames is not None:
            if text.startswith((" ", "\t")) or not text.strip():
                frames.append(text)
                continue
            if not EXCEPTION.match(text):  # another process's line amid the traceback
                continue
            launcher = bool(frames) and LAUNCHER_FRAMES.search(frames[0]) is not None
            launcher = launcher or any(w in text for w in WRAPPERS)
            found.append(Raised(rank, text.strip(), index, launcher))
            open_at[rank] = None
        elif any(text.startswith(c) for c in CHAINED):
            earlier = next((r for r in reversed(found) if r.rank == rank), None)
            if earlier is not None:
                found.remove(earlier)
    return found


def cause(lines: Sequence[str]) -> str:
    """The most telling line of a failed run's output: the project's one-line error that says what happened (rather
    than pointing at a traceback); else the exception of the rank the launcher names as the first that failed
    (`rank 1: ValueError: ...`), or the first exception a rank printed; else the project's error line, any error
    line, the last line."""
    bare = [split(line)[1].strip() for line in lines]
    bare = [line for line in bare if line]
    ours = [line for line in bare if OURS in line]
    told = [line for line in ours if "(traceback above)" not in line]
    if told:
        return told[-1]
    exceptions = [r for r in raised(lines) if not r.launcher]
    if exceptions:
        failed = first_failed(lines)
        chosen = next((r for r in exceptions if r.rank is not None and r.rank == failed), exceptions[0])
        return f"rank {chosen.rank}: {chosen.text}" if chosen.rank is not None else chosen.text
    for candidates in (ours, [line for line in bare if "error:" in line.lower()], bare):
        if candidates:
            return candidates[-1]
    return "no output"


def failed_with(error: str, clash: Optional[str]) -> str:
    """A failed run's line: its own error; after a clash, the clash first, and the error only where it is not one
    of the probe's refusals (what the probe could not follow in a run that read another's state, as a run that
    resumed past its last step and made no step, says nothing of the script)."""
    if clash is None:
        return error
    return clash if "probe: error:" in error else f"{clash}; then {error}"
