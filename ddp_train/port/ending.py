"""The end of the port's main path: where the port starts the process group (else where it wraps a model in DDP),
it registers destroy_process_group_at_exit() (port.helpers), so that once the script has ended, by returning or by
an exception, and before Python finalizes, its DDP models are let go and the process group destroyed.

Why (a backtrace of the abort shows it): when Python finalizes right after the script's last collective, a Gloo worker
thread of the process group, still alive, lets go of that collective's tensor, must take the GIL to free its Python
object, and Python, finalizing, ends the thread with pthread_exit, whose unwinding through a noexcept destructor
calls std::terminate ("terminate called without an active exception", SIGABRT). The end runs between the script's
end and the finalization, after the traceback of a failure: the DDP models go, the group is destroyed, and by then
the workers have let go of the last collective. (They stay: torch.distributed.nn.functional, which DDP imports,
holds the group in default arguments, so destroy_process_group() cannot join them; nothing waits on them either.)

Registered with atexit where the group starts rather than written where the script ends: one line, the script's own
lines left as they are (a try/finally would indent the whole `if __name__ == "__main__":` block), the same for a
main() function, for code at module level and for a script that fails; and on an exception it runs after Python has
printed the traceback, so neither the traceback nor the exit code changes."""

from __future__ import annotations

from typing import List, Optional, Set

import libcst as cst

from .context import Context, code

HELPER = "destroy_process_group_at_exit"
RULE = "the end of the main path"


class _Find(cst.CSTVisitor):
    """The first statement line that starts the process group and the first that wraps one of `models` in DDP;
    whether the module already registers the helper (a port ported again): defines it and calls it."""

    def __init__(self, dist: str, ddp: str, models: Set[str], helpers: Set[str]) -> None:
        self.dist, self.ddp, self.models, self.helpers = dist, ddp, models, helpers
        self.line: Optional[cst.SimpleStatementLine] = None
        self.init: Optional[cst.SimpleStatementLine] = None
        self.wrap: Optional[cst.SimpleStatementLine] = None
        self.called: Set[str] = set()
        self.defined: Set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value in self.helpers and "atexit.register(end)" in code(node):
            self.defined.add(node.name.value)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.line = node
        for small in node.body:
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and \
                    isinstance(small.value.func, cst.Name) and small.value.func.value in self.helpers:
                self.called.add(small.value.func.value)
            if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and self.wrap is None and \
                    code(small.value.func) == self.ddp and \
                    any(code(target.target) in self.models for target in small.targets):
                self.wrap = node

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self.line = None

    def visit_Call(self, node: cst.Call) -> None:
        if self.line is not None and self.init is None and code(node.func) == f"{self.dist}.init_process_group":
            self.init = self.line


class _Register(cst.CSTTransformer):
    """The helper's call written in `anchor`'s block, on the line after it or `before` it."""

    def __init__(self, anchor: cst.SimpleStatementLine, call: cst.SimpleStatementLine, before: bool) -> None:
        self.anchor, self.call, self.before = anchor, call, before

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.SimpleStatementLine]:
        if original_node is not self.anchor:
            return updated_node
        if self.before:  # the lines above the anchor (comments) stay above the pair
            return cst.FlattenSentinel([self.call.with_changes(leading_lines=updated_node.leading_lines),
                                        updated_node.with_changes(leading_lines=[])])
        return cst.FlattenSentinel([updated_node, self.call])


def _line(ctx: Context, rule: str) -> int:
    """The Horovod script's line of the first change by `rule` (0 when there is none)."""
    lines: List[int] = sorted(c.line for c in ctx.changes if c.rule == rule)
    return lines[0] if lines else 0


def end_cleanly(module: cst.Module, ctx: Context, models: Set[str]) -> cst.Module:
    """`module` (the port, before its imports are finished) with destroy_process_group_at_exit() called on the line
    after the first `dist.init_process_group(...)`, else on the line before the first `model = DDP(...)` of one of
    `models`; as it is when the port does neither, or when it already calls the helper (porting a port changes
    nothing)."""
    found = _Find(ctx.name("dist"), ctx.name("DDP"), models, {HELPER, f"{HELPER}_ddp"})  # its name, or Context's other
    module.visit(found)
    anchor = found.init or found.wrap
    if anchor is None or found.called & found.defined:
        return module
    name = ctx.helper(HELPER)
    call = cst.parse_statement(f"{name}()\n", config=module.config_for_parsing)
    assert isinstance(call, cst.SimpleStatementLine)
    where = "after the process group starts" if found.init is not None else "before the model's DDP wrap"
    ctx.change(_line(ctx, "hvd.init" if found.init is not None else "hvd.DistributedOptimizer"), RULE,
               f"{name}() {where}: once the script has ended (returned or failed) and before Python finalizes, its "
               "DDP models are let go and the process group destroyed (unless the script did); finalizing right after "
               "the last collective can abort a rank whose training is done (SIGABRT)")
    return module.visit(_Register(anchor, call, before=found.init is None))
