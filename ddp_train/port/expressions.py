"""Rules for Horovod calls and names inside expressions: ranks and sizes, the collectives on tensors and
objects, build queries, hvd.SyncBatchNorm and the compression constants."""

from __future__ import annotations

from typing import Callable, Dict, Optional

import libcst as cst
from libcst.metadata import Scope

from . import engines
from .accumulation import pure
from .context import Context, arguments, code
from .helpers import HELPERS
from .names import HorovodNames
from .rule import Expression

#: torch.distributed's reduction for each Horovod op a collective can take besides Average
REDUCE_OPS = {"Sum": "SUM", "Min": "MIN", "Max": "MAX", "Product": "PRODUCT"}


def _launcher_number(variable: str, meaning: str) -> Callable[[Context], Expression]:
    return lambda ctx: Expression(ctx.env_int(variable), f"{meaning}, from torchrun's environment ({variable})")


#: calls without arguments: api -> the DDP expression and what it is
QUERIES: Dict[str, Callable[[Context], Expression]] = {
    "rank": lambda ctx: Expression(f"{ctx.dist}.get_rank()", "this process's rank"),
    "size": lambda ctx: Expression(f"{ctx.dist}.get_world_size()", "the number of processes"),
    "local_rank": _launcher_number("LOCAL_RANK", "the rank on this host"),
    "local_size": _launcher_number("LOCAL_WORLD_SIZE", "the number of processes on this host"),
    "cross_rank": _launcher_number("GROUP_RANK", "this host's index"),
    "cross_size": _launcher_number("GROUP_WORLD_SIZE", "the number of hosts"),
    "is_initialized": lambda ctx: Expression(f"{ctx.dist}.is_initialized()", "whether the process group is up"),
    "nccl_built": lambda ctx: Expression(f"{ctx.dist}.is_nccl_available()", "whether torch has NCCL"),
    "gloo_built": lambda ctx: Expression(f"{ctx.dist}.is_gloo_available()", "whether torch has Gloo"),
    "mpi_built": lambda ctx: Expression(f"{ctx.dist}.is_mpi_available()", "whether torch has MPI"),
    "cuda_built": lambda ctx: Expression("torch.backends.cuda.is_built()", "whether torch is built with CUDA"),
    "barrier": lambda ctx: Expression(f"{ctx.dist}.barrier()", "waits for every rank"),
    "shutdown": lambda ctx: Expression(f"{ctx.dist}.destroy_process_group()", "leaves the process group"),
}


#: the collectives whose value the port writes as an expression
COLLECTIVES = ("allreduce", "allreduce_", "grouped_allreduce", "allgather", "allgather_object", "broadcast",
               "broadcast_", "broadcast_object")


def init(ctx: Context) -> Expression:
    """hvd.init() -> joining the process group torchrun describes."""
    ctx.imports.add("torch")
    backend = f"{ctx.string('cpu:gloo,cuda:nccl')} if torch.cuda.is_available() else {ctx.string('gloo')}"
    return Expression(f"{ctx.dist}.init_process_group({backend})",
                      "joins torchrun's process group: Gloo for CPU tensors, NCCL for CUDA ones where CUDA is "
                      "available (Horovod's collectives take CPU tensors on GPU machines too)")


def _op(names: HorovodNames, options: Dict[str, cst.BaseExpression], scope: Optional[Scope] = None) -> Optional[str]:
    """"Average", "Sum", "Min", ... for a collective's op= and deprecated average=; None when it is no constant."""
    if "op" in options:
        api = names.api(options["op"], scope)
        return api if api in ("Average", *REDUCE_OPS) else None
    average = options.get("average")
    if average is None or (isinstance(average, cst.Name) and average.value in ("True", "None")):
        return "Average"
    if isinstance(average, cst.Name) and average.value == "False":
        return "Sum"
    return None


def _plain(names: HorovodNames, options: Dict[str, cst.BaseExpression], scope: Optional[Scope] = None) -> bool:
    """No option the port cannot carry: a process set, compression, scale factors."""
    if "process_set" in options:
        return False
    if "compression" in options and names.api(options["compression"], scope) != "Compression.none":
        return False
    return all(k not in options or code(options[k]) in ("1", "1.0") for k in ("prescale_factor", "postscale_factor"))


def _reduced(ctx: Context, tensor: str, op: str) -> Expression:
    """The expression that reduces `tensor` into a new tensor, and what it does."""
    if op == "Average":
        return Expression(f"{ctx.helper('all_averaged')}({tensor})",
                          "the sum over the ranks, then divided by their number")
    reduce_op = "" if op == "Sum" else f", {ctx.dist}.ReduceOp.{REDUCE_OPS[op]}"
    return Expression(f"{ctx.helper('all_reduced')}({tensor}{reduce_op})", f"op={op}")


def _named(options: Dict[str, cst.BaseExpression]) -> str:
    return "; name dropped (torch.distributed matches collectives by their order on every rank)" \
        if "name" in options else ""


def collective(ctx: Context, api: str, call: cst.Call, scope: Optional[Scope]) -> Optional[Expression]:
    """A collective used for its value -> its DDP expression; None when it cannot be ported. `call`
    is the rewrite's (its arguments already ported), read in `scope`."""
    options = arguments(call, api) if api in COLLECTIVES else None
    if options is None or not _plain(ctx.names, options, scope):
        return None
    if api in ("allreduce", "allreduce_", "grouped_allreduce"):
        op = _op(ctx.names, options, scope)
        first = options.get("tensors" if api == "grouped_allreduce" else "tensor")
        if op is None or first is None:
            return None
        if api == "grouped_allreduce":
            each = _reduced(ctx, "tensor", op)
            return Expression(f"[{each.text} for tensor in {code(first)}]", each.does + _named(options))
        reduced = _reduced(ctx, code(first), op)
        if api == "allreduce_":
            if not pure(first):
                return None
            return Expression(f"{code(first)}.copy_({reduced.text})",
                              reduced.does + ", written back into the tensor" + _named(options))
        return Expression(reduced.text, reduced.does + _named(options))
    if api == "allgather" and "tensor" in options:
        return Expression(f"{ctx.helper('all_gathered')}({code(options['tensor'])})",
                          "every rank's tensor concatenated along the first dimension" + _named(options))
    if api == "allgather_object" and "obj" in options:
        return Expression(f"{ctx.helper('all_gathered_objects')}({code(options['obj'])})",
                          "every rank's object, in a list" + _named(options))
    if api in ("broadcast", "broadcast_") and "tensor" in options and "root_rank" in options:
        tensor, root = code(options["tensor"]), code(options["root_rank"])
        copied = f"{ctx.helper('broadcasted')}({tensor}, {root})"
        if api == "broadcast_":
            if not pure(options["tensor"]):
                return None
            return Expression(f"{tensor}.copy_({copied})", f"rank {root}'s tensor, written into this one"
                              + _named(options))
        return Expression(copied, f"rank {root}'s tensor, in a new tensor" + _named(options))
    if api == "broadcast_object" and "obj" in options:
        given = options.get("root_rank")
        root = code(given) if given is not None else "0"
        src = "" if root == "0" else f", {root}"
        return Expression(f"{ctx.helper('broadcasted_object')}({code(options['obj'])}{src})",
                          f"rank {root}'s object" + _named(options))
    return None


#: a rule for a Horovod call inside an expression: (the port, the API, the call as the rewrite has it, the scope
#: it is read in) -> the DDP expression, or None: left as written
CallRule = Callable[[Context, str, cst.Call, Optional[Scope]], Optional[Expression]]


def _query(ctx: Context, api: str, call: cst.Call, scope: Optional[Scope]) -> Optional[Expression]:
    return QUERIES[api](ctx) if not call.args else None


def _init(ctx: Context, api: str, call: cst.Call, scope: Optional[Scope]) -> Optional[Expression]:
    return init(ctx) if not call.args else None


#: the rule of each Horovod call the port writes as an expression
CALLS: Dict[str, CallRule] = {**{api: _query for api in QUERIES}, "init": _init,
                              **{api: collective for api in COLLECTIVES}, engines.SPARK_RUN: engines.spark_run}
HELPERS.update(engines.HELPERS)  # the Spark and Ray drivers' helpers, written with their rules


def in_place_portable(names: HorovodNames, api: str, call: cst.Call) -> bool:
    """hvd.allreduce_ (a sum, min, max or product) or hvd.broadcast_ that in_place_statement ports."""
    options = arguments(call, api)
    if options is None or not _plain(names, options) or "tensor" not in options:
        return False
    if api == "broadcast_":
        return "root_rank" in options
    return _op(names, options) in REDUCE_OPS


def in_place_statement(ctx: Context, api: str, call: cst.Call) -> Optional[Expression]:
    """hvd.allreduce_ (a sum, min, max or product) and hvd.broadcast_ as statements: torch.distributed's own
    in-place calls."""
    options = arguments(call, api)
    if options is None or not in_place_portable(ctx.names, api, call):
        return None
    tensor = code(options["tensor"])
    if api == "broadcast_" and "root_rank" in options:
        root = code(options["root_rank"])
        return Expression(f"{ctx.dist}.broadcast({tensor}, src={root})",
                          f"rank {root}'s tensor, in place" + _named(options))
    if api == "allreduce_":
        op = _op(ctx.names, options)
        if op in REDUCE_OPS:
            reduce_op = "" if op == "Sum" else f", op={ctx.dist}.ReduceOp.{REDUCE_OPS[op]}"
            return Expression(f"{ctx.dist}.all_reduce({tensor}{reduce_op})", f"op={op}, in place" + _named(options))
    return None


#: what torch's SyncBatchNorm does not do that Horovod's does
SYNC_BATCH_NORM_CPU = ("torch.nn.SyncBatchNorm runs on CUDA only: on CPU the port stops at the first forward "
                       "(\"SyncBatchNorm layers only work with GPU modules\"), where Horovod's layer trains; on CUDA "
                       "it is the same layer. For CPU runs use torch.nn.BatchNorm (statistics per rank)")


def constant(ctx: Context, api: str) -> Optional[Expression]:
    """Horovod names used as values: hvd.SyncBatchNorm, the compression constants."""
    if api == "SyncBatchNorm":
        ctx.imports.add("torch")
        return Expression("torch.nn.SyncBatchNorm", "the same layer in torch (torch.nn.SyncBatchNorm)",
                          SYNC_BATCH_NORM_CPU)
    if api == "Compression.none":
        return Expression("None", "no DDP communication hook")
    if api == "Compression.fp16":
        ctx.imports.add("default_hooks")
        return Expression(f"{ctx.name('default_hooks')}.fp16_compress_hook", "DDP's float16 compression hook")
    return engines.constant(ctx, api)
