"""What a command's output says: the line that says why it failed, and its last lines."""

from __future__ import annotations

import re
from pathlib import Path

#: an error line: Python's exceptions, `error:` of pip, CMake and compilers; and the lines that only say that
#: another line said why
ERROR_LINE = re.compile(r"(^|\s)([\w.]*(Error|Exception)|[Ee]rror|ERROR):\s")
NOT_THE_REASON = ("subprocess-exited-with-error", "metadata-generation-failed", "ChildFailedError",
                  "See above for", "note: This error originates")


def one_line(text: str, limit: int = 400) -> str:
    """`text` on one line, its white space collapsed, cut at `limit` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def error_line(output: str) -> str | None:
    """The line that says why a command failed: the last error line of the project's programs (`PROG: error: ...`),
    else the last other error line (an exception, pip's, CMake's, a compiler's), else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ours = [line for line in lines if ": error: " in line]
    if ours:
        return one_line(ours[-1])
    errors = [line for line in lines if ERROR_LINE.search(line) and not any(s in line for s in NOT_THE_REASON)]
    if errors:
        return one_line(errors[-1])
    return one_line(lines[-1]) if lines else None


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of the file at `path`; none where it cannot be read."""
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
