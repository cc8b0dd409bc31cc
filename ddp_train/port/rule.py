"""What a rule reads and what it returns: a statement rule is a function of one `StatementSite` (a statement where
an idiom is, with what the port knows around it) that returns a `Replace` or None (left as written); the rules of
port.wrapped return `Unwrap` and `Through`, those of port.expressions an `Expression`, port.accumulation's a
`WrapIn`. The porter (port.transform) finds the sites, asks the rules and applies their edits. Rules record what they
did in the port's report, and ask for the imports and helpers their text uses, through `StatementSite.port`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import libcst as cst

from .context import Context
from .plan import Plan, Scope


@dataclass(frozen=True)
class StatementSite:
    """A statement of the script a rule may port: `statement` as the script wrote it, the Horovod `api` its call
    names (None for a statement on a wrapped optimizer, e.g. `optimizer.synchronize()`), its `line`, the `scope`
    it is in (the function, else the module), the port's state and the plan."""

    statement: cst.SimpleStatementLine
    call: cst.Call
    api: Optional[str]
    line: int
    scope: Scope
    port: Context
    plan: Plan


@dataclass(frozen=True)
class Replace:
    """The statement replaced by `texts` (each a statement; none: the statement removed, its blank lines kept),
    under its comments and `comments` (`# port:` lines)."""

    texts: Tuple[str, ...] = ()
    comments: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Expression:
    """A Horovod call or name inside an expression, ported (port.expressions): `text`, the DDP expression; what it
    `does`, in the report's words; and where it can train otherwise than Horovod, how (`effect`; None: it cannot)."""

    text: str
    does: str
    effect: Optional[str] = None


@dataclass(frozen=True)
class WrapIn:
    """Statements `first` to `last` of a block (indices into its body, as the script wrote it) put, as the rewrite
    made them, under a compound statement whose first line is `header` (e.g. `with model.no_sync():`)."""

    first: int
    last: int
    header: str


@dataclass(frozen=True)
class Unwrap:
    """A compound statement replaced by its body (e.g. `with optimizer.skip_synchronize():`)."""


@dataclass(frozen=True)
class Through:
    """An attribute read through another: `x.attr` -> `x.<via>.attr` (the model's own attributes after the DDP
    wrap: `model.module.attr`)."""

    via: str


@dataclass(frozen=True)
class StatementRule:
    """One idiom ported as a whole statement: `claims` says whether the rule owns a statement (the porter then
    does not walk into it), `port` what replaces it (None: left as written, marked unported if it names
    Horovod). `apis` are the Horovod calls it claims (empty: a rule that looks at other statements)."""

    idiom: str
    apis: Tuple[str, ...]
    claims: Callable[[StatementSite], bool]
    port: Callable[[StatementSite], Optional[Replace]]

