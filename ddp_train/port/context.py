"""What one port carries through its rules: the script's Horovod names, the names the port writes (the
script's quote style, free names for torch.distributed and the helpers), the imports and helpers its rewrites
need, and the report they fill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Union, cast

import libcst as cst

from .helpers import HELPERS
from .names import HorovodNames
from .report import Change, Unported

#: the names the port binds, by what they are: {key: (preferred, fallback)}
IMPORTED = {"dist": ("dist", "torch_dist"), "DDP": ("DDP", "DistributedDataParallel"),
            "default_hooks": ("default_hooks", "ddp_default_hooks")}

#: Horovod's signatures, in its own order, for reading positional and keyword arguments alike
SIGNATURES: Dict[str, Sequence[str]] = {
    "allreduce": ("tensor", "average", "name", "compression", "op", "prescale_factor", "postscale_factor",
                  "process_set"),
    "allreduce_": ("tensor", "average", "name", "op", "prescale_factor", "postscale_factor", "process_set"),
    "grouped_allreduce": ("tensors", "average", "name", "compression", "op", "prescale_factor",
                          "postscale_factor", "process_set"),
    "allgather": ("tensor", "name", "process_set"),
    "allgather_object": ("obj", "name"),
    "broadcast": ("tensor", "root_rank", "name", "process_set"),
    "broadcast_": ("tensor", "root_rank", "name", "process_set"),
    "broadcast_object": ("obj", "root_rank", "name", "process_set"),
    "join": ("device",),
    "barrier": ("process_set",),
    "init": ("comm", "process_sets"),
    "shutdown": (),
    "DistributedOptimizer": ("optimizer", "named_parameters", "compression", "backward_passes_per_step", "op",
                             "gradient_predivide_factor", "num_groups", "groups", "sparse_as_dense",
                             "process_set"),
    "broadcast_parameters": ("params", "root_rank"),
    "broadcast_optimizer_state": ("optimizer", "root_rank", "model"),
}


def arguments(call: cst.Call, api: str) -> Optional[Dict[str, cst.BaseExpression]]:
    """`call`'s arguments by the name Horovod's `api` gives them; None when they cannot be read (*args,
    **kwargs, a keyword or a position the signature does not have)."""
    signature = SIGNATURES[api]
    found: Dict[str, cst.BaseExpression] = {}
    for position, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is None:
            if position >= len(signature):
                return None
            found[signature[position]] = arg.value
        elif arg.keyword.value in signature:
            found[arg.keyword.value] = arg.value
        else:
            return None
    return found


Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]


def above(statement: cst.CSTNode) -> List[cst.EmptyLine]:
    """The lines (blank or comments) above a statement."""
    return list(cast(Statement, statement).leading_lines)


def with_above(statement: cst.CSTNode, lines: Sequence[cst.EmptyLine]) -> Statement:
    """`statement` with `lines` above it."""
    return cast(Statement, statement).with_changes(leading_lines=list(lines))


def code(node: cst.CSTNode) -> str:
    """The source text of a node."""
    return cst.Module(body=[]).code_for_node(node)


def first_line(node: cst.CSTNode) -> str:
    """The first line of a node's source, without leading comments and indentation."""
    if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        node = node.with_changes(leading_lines=[])
    lines = code(node).strip().splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True)
class Options:
    """How to port: `zero_step` "drop" (DDP's idiom, reported) or "keep" (Horovod's zero step made explicit)."""

    zero_step: str = "drop"


class Context:
    """The state of one port."""

    def __init__(self, names: HorovodNames, bound: Set[str], quote: str, options: Options) -> None:
        self.names = names
        self.bound = bound
        self.quote = quote
        self.options = options
        self.changes: List[Change] = []
        self.unported: List[Unported] = []
        self.imports: Set[str] = set()
        self.helpers: Set[str] = set()
        self._taken: Dict[str, str] = {}
        self.zero_step: Optional[str] = None
        #: variables that hold a Horovod compression (every assignment to them is one): name -> True
        self.compressions: Dict[str, bool] = {}
        #: what the script calls load_state_dict on
        self.loads_state: Set[str] = set()
        #: the wrapped models that can skip parameters in a step, and why (port.follow.Skipping)
        self.skipping: Dict[str, Any] = {}
        #: the module-level functions that hold a model wrapped in another file: function -> the model's parameter
        self.handed_models: Dict[str, str] = {}

    def name(self, key: str) -> str:
        """The name the port writes for `key` (an import or a helper), one the script does not bind already."""
        if key not in self._taken:
            preferred, fallback = IMPORTED.get(key, (key, f"{key}_ddp"))
            self._taken[key] = preferred if preferred not in self.bound else fallback
        return self._taken[key]

    @property
    def dist(self) -> str:
        """torch.distributed's name in the port."""
        self.imports.add("dist")
        return self.name("dist")

    def helper(self, key: str) -> str:
        """Use helper `key` (and what it calls): its name in the port."""
        self.helpers.add(key)
        for dependency in HELPERS[key].uses:
            if dependency in HELPERS:
                self.helper(dependency)
            else:
                self.imports.add(dependency)
        return self.name(key)

    def string(self, text: str) -> str:
        """`text` as a literal in the script's quotes."""
        q = self.quote
        return q + text.replace("\\", "\\\\").replace(q, "\\" + q) + q

    def env_int(self, variable: str) -> str:
        """int(os.environ[VARIABLE]): a number torchrun gives each process."""
        self.imports.add("os")
        return f"int(os.environ[{self.string(variable)}])"

    def change(self, line: int, rule: str, text: str, changes_training: bool = False,
               effect: Optional[str] = None, cause: Optional[str] = None) -> None:
        """Record a rewrite."""
        self.changes.append(Change(line, rule, text, changes_training, effect, cause))

    def leave(self, line: int, node: cst.CSTNode, reason: str) -> None:
        """Record a Horovod call left as it is."""
        self.unported.append(Unported(line, first_line(node), reason))
