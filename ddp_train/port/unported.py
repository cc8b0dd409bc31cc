"""What the port leaves as Horovod: the references it found no rule for, why, and the comment above them."""

from __future__ import annotations

from typing import List, Optional, Sequence, Set

import libcst as cst
from libcst.metadata import Scope

from .names import HorovodNames, dotted

#: why a Horovod API has no rewrite, by its first name
REASONS = {
    "Adasum": "DDP has no Adasum: average the gradients and retune the learning rate",
    "ProcessSet": "process sets: use dist.new_group(ranks) and pass it as group= / process_group=",
    "add_process_set": "process sets: use dist.new_group(ranks)",
    "remove_process_set": "process sets: use dist.new_group(ranks)",
    "global_process_set": "process sets: torch.distributed's default group is every rank",
    "elastic": "Horovod elastic: use torchrun --max-restarts with checkpoints",
    "poll": "asynchronous collectives: use async_op=True and work.wait()",
    "synchronize": "asynchronous collectives: use async_op=True and work.wait()",
    "alltoall": "use dist.all_to_all_single (with the split sizes of every rank)",
    "reducescatter": "use dist.reduce_scatter_tensor",
    "grouped_reducescatter": "use dist.reduce_scatter_tensor per tensor",
    "grouped_allgather": "use all_gathered per tensor",
    "join": "hvd.join()'s value (the last rank to join) has no torch.distributed counterpart",
    "HorovodInternalError": "torch.distributed raises DistBackendError",
    "mpi_threads_supported": "no torch.distributed counterpart",
    "mpi_enabled": "no torch.distributed counterpart: dist.get_backend() names the backend",
    "gloo_enabled": "no torch.distributed counterpart: dist.get_backend() names the backend",
}
PREFIX = "# port: not ported: "


def reason(api: str) -> str:
    """Why `api` (e.g. "allreduce_async") has no rewrite."""
    head = api.split(".")[0]
    if head.endswith("_async") or head.endswith("_async_"):
        return REASONS["poll"]
    return REASONS.get(head, f"no rule rewrites hvd.{api} (see docs/migrating-from-horovod.md#the-map)")


class _References(cst.CSTVisitor):
    def __init__(self, names: HorovodNames, scope: Optional[Scope]) -> None:
        self.names = names
        self.scope = scope
        self.found: List[cst.BaseExpression] = []
        #: the parameters of the lambdas around a node: their names are not the script's Horovod
        self.shadowed: List[Set[str]] = []

    def _horovod(self, name: Optional[str]) -> bool:
        head = (name or "").split(".")[0]
        return not any(head in names for names in self.shadowed)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if self.names.api(node, self.scope) is not None and self._horovod(dotted(node)):
            self.found.append(node)
            return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        if self.names.module_of(node.value, self.scope) is not None and self._horovod(node.value):
            self.found.append(node)

    def visit_Param(self, node: cst.Param) -> bool:
        # a parameter's name is bound, not read: only its annotation and default can name Horovod
        for part in (node.annotation, node.default):
            if part is not None:
                part.visit(self)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.shadowed.append({param.name.value for param in node.params.params})

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self.shadowed.pop()

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> bool:
        return False  # a compound statement's body is judged statement by statement


def references(names: HorovodNames, parts: Sequence[cst.CSTNode], scope: Optional[Scope]) -> List[cst.BaseExpression]:
    """The Horovod references in `parts` (not in nested blocks), read in `scope`."""
    finder = _References(names, scope)
    for part in parts:
        part.visit(finder)
    return finder.found


def comment_line(spelled: str, why: str, indent: int, width: int = 120) -> str:
    """The one-line comment above what was left, cut to fit `width` columns at `indent`."""
    text = f"{PREFIX}{spelled}: {why}"
    room = width - indent
    return text if len(text) <= room else text[:room - 3].rstrip() + "..."


def with_comment(statement: cst.CSTNode, text: str) -> cst.CSTNode:
    """`statement` with `text` as the last comment line above it (once: porting twice adds nothing)."""
    lines = list(getattr(statement, "leading_lines", []))
    if lines and lines[-1].comment is not None and lines[-1].comment.value == text:
        return statement
    return statement.with_changes(leading_lines=[*lines, cst.EmptyLine(indent=True, comment=cst.Comment(text))])
