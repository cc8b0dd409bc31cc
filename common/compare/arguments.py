"""Command-line values shared by the comparison and the benchmark scripts."""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable, List, Optional, Sequence


def csv_list(kind: Callable[[str], Any] = str, choices: Optional[Sequence[Any]] = None,
             minimum: Optional[int] = None) -> Callable[[str], List[Any]]:
    """An argparse `type` for comma-separated values: "1,2,4" -> [1, 2, 4]. It refuses an empty list,
    values that are not of `kind`, values outside `choices` and numbers below `minimum`, each with a
    message that names the problem."""
    what = "integers" if kind is int else "numbers" if kind is float else "values"

    def parse(text: str) -> List[Any]:
        try:
            items = [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}") from None
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r}: give at least one value")
        if choices is not None:
            bad = [x for x in items if x not in choices]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"unknown {', '.join(map(str, bad))}; choose from {', '.join(map(str, choices))}")
        if minimum is not None and min(items) < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= {minimum}")
        return items

    return parse


#: binary units of byte_size
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def byte_size(text: str) -> int:
    """'4', '64K', '256M', '1G' (binary units) -> bytes (an argparse `type`)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text.upper())
    if not m or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 4, 64K, 256M")
    return int(m.group(1)) * UNITS[m.group(2)]


#: world sizes: "1,2,4"
world_sizes = csv_list(int, minimum=1)
