"""Horovod's DistributedOptimizer: the script's optimizer, of its own class, whose gradients are averaged over the
ranks before each step.

As in Horovod, the wrapped optimizer is a new object of a subclass of the script's optimizer class made on the spot,
built on the same parameter groups; a hook on every parameter starts its gradient's allreduce as soon as backward has
accumulated it (so communication overlaps the rest of backward; the coordinator fuses allreduces that become ready
together into one buffer), and `step()` (or `synchronize()`) waits for them and puts the averages into `.grad`.
Parameters whose gradient was not computed on a rank are reduced with zeros, so every rank takes part.
The checks that every rank's gradient has the same shape and type run on the first step only: a model's parameters
keep their shapes, so later steps' allreduces skip them. From the second step on, dense gradients are asked for by
bucket (buckets.py), one request for many gradients, where the reduction is the same element by element: no groups,
no compression or float16's, fusion on (HOROVOD_FUSION_THRESHOLD > 0)."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch

from . import runtime
from .buckets import BUCKET_BYTES, FIRST_BUCKET_BYTES, Bucket, Slot, digest, layout
from .compression import Compression, FP16Compressor, NoneCompressor
from .dtypes import ADASUM, AVERAGE, MAX
from .exceptions import ADASUM_REFUSED
from .functions import broadcast_object
from .enqueue import synchronize
from .mpi_ops import _allreduce_async, allreduce, grouped_allreduce_async_, sparse_allreduce_async
from .process_sets import ProcessSet, global_process_set


def split_list(items: Sequence[Any], parts: int) -> List[List[Any]]:
    """`items` in `parts` consecutive runs of sizes differing by at most one (the longer ones first)."""
    share, extra = divmod(len(items), parts)
    return [list(items[i * share + min(i, extra):(i + 1) * share + min(i + 1, extra)]) for i in range(parts)]


def grad_accumulator(p: torch.Tensor) -> Any:
    """The autograd node that accumulates a leaf's gradient (held, it stays the node every forward uses)."""
    node = p.view_as(p).grad_fn
    assert node is not None  # (a parameter that requires grad)
    return node.next_functions[0][0]


def _duplicates(names: Sequence[str]) -> Set[str]:
    seen: Set[str] = set()
    return {name for name in names if name in seen or seen.add(name)}  # type: ignore[func-returns-value]


TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                   "Increase backward_passes_per_step to accumulate gradients locally.")


@dataclass(eq=False)
class Reduction:
    """One allreduce a DistributedOptimizer asks for in a step, under the name of its request: of one parameter's
    gradient, of a group's (`grouped`), or of a bucket's (`bucket`). `wait()` gives its result once it started; until
    then (None) it has begun: some of its gradients came, and zero_grad() is the script's error. `ctx` is the
    compression's."""

    name: str
    params: Tuple[torch.Tensor, ...]
    wait: Optional[Callable[[], Any]] = None
    ctx: Any = None
    grouped: bool = False
    bucket: Optional[Bucket] = None


class _DistributedOptimizer(torch.optim.Optimizer):
    """The part of a DistributedOptimizer that is not the script's optimizer (first in its class's MRO)."""

    _horovod_api_distributed = True

    def __init__(self, params: Any, named_parameters: Any, compression: Any, backward_passes_per_step: int = 1,
                 op: int = AVERAGE, gradient_predivide_factor: float = 1.0, groups: Any = None,
                 sparse_as_dense: bool = False, process_set: ProcessSet = global_process_set) -> None:
        # The script's optimizer class (next in the MRO), on the script optimizer's parameter groups.
        super().__init__(params)  # type: ignore[call-arg]
        self._compression = compression
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v) for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                             "model.named_parameters().")
        dups = _duplicates([k for k, _ in named_parameters])
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: %s"
                             % ", ".join(sorted(dups)))
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        unnamed = all_ids - {id(v) for _, v in named_parameters}
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                             "Python object ids: %s" % ", ".join(str(i) for i in unnamed))
        ordered = sorted(named_parameters, key=lambda item: item[0])
        self._parameter_names: Dict[torch.Tensor, str] = {v: k for k, v in ordered}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay: Dict[torch.Tensor, int] = {v: backward_passes_per_step for _, v in ordered}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles: Dict[str, Reduction] = {}  # this step's reductions, by name
        self._grad_accs: Dict[int, Any] = {}  # id(parameter) -> its hook's handle
        self._requires_update: Set[torch.Tensor] = set()
        self._synchronized = False
        self._should_synchronize = True
        self._checked = False  # every rank's gradients were matched once
        if groups is not None:
            if not (isinstance(groups, list) or groups > 0):
                raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
            if isinstance(groups, list):
                seen: Set[int] = set()
                for group in groups:
                    for p in group:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("groups must consist of torch.Tensor.")
                        if id(p) in seen:
                            raise ValueError("A parameter can only appear once in groups.")
                        seen.add(id(p))
        self._groups = groups
        self._p_to_group: Dict[torch.Tensor, Tuple[torch.Tensor, ...]] = {}
        self._group_counts: Dict[Tuple[torch.Tensor, ...], int] = {}
        self._bucket_slots: Dict[int, Tuple[Bucket, int]] = {}  # id(parameter) -> its bucket, its place in it
        self._buckets: List[Bucket] = []
        self._unbucketed: Set[torch.Tensor] = set()  # with buckets: the parameters reduced one by one
        self._buckets_gen = -1  # the generation (hvd.init) the buckets were agreed in
        if process_set.included() and (runtime.size() > 1 or runtime.active().settings.elastic):
            self._register_hooks()

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for bucket in self._buckets:
            bucket.restart(self.backward_passes_per_step)
        super().load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Reduce gradients every `passes` backward passes (they accumulate locally in between)."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes
        for bucket in self._buckets:
            bucket.restart(passes)

    def _register_hooks(self) -> None:
        if self._groups is not None:
            params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
            # Every rank forms the groups in rank 0's order of the parameters.
            names = broadcast_object([self._parameter_names.get(p) for p in params], root_rank=0,
                                     process_set=self.process_set)
            params.sort(key=lambda p: names.index(self._parameter_names.get(p)))
            if isinstance(self._groups, list):
                ids = {id(p) for p in params}
                grouped: List[List[torch.Tensor]] = [[p for p in group if id(p) in ids] for group in self._groups]
                taken = {id(p) for group in grouped for p in group}
                grouped += [[p] for p in params if id(p) not in taken]
            else:
                grouped = split_list(params, self._groups)
            for members in grouped:
                key = tuple(members)
                for p in key:
                    self._p_to_group[p] = key
                self._group_counts[key] = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    self._grad_accs[id(p)] = p.register_post_accumulate_grad_hook(self._make_hook(p))

    def _allreduce_grad_async(self, p: torch.Tensor) -> Reduction:
        if p.grad is None:
            # Not computed on this rank this step (another rank may have): reduce zeros, so every rank takes part.
            p.grad = p.data.new(p.size()).zero_()
        name = str(self._parameter_names.get(p))
        tensor = p.grad
        if tensor.is_sparse:
            if self.sparse_as_dense:
                tensor = tensor.to_dense()
            else:
                return Reduction(name, (p,), sparse_allreduce_async(p.grad, name=name, op=self.op,
                                                                    process_set=self.process_set))
        compressed, ctx = self._compression.compress(tensor)
        prescale, postscale = self._scales()
        handle = _allreduce_async(compressed, compressed, name, self.op, prescale, postscale, self.process_set,
                                  checked=self._checked)
        return Reduction(name, (p,), partial(synchronize, handle), ctx)

    def _scales(self) -> Tuple[float, float]:
        if self.op == AVERAGE:
            # The average split around the sum: 1/f before, f/size after (Horovod's gradient_predivide_factor).
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    # --- buckets (from the second step on) -----------------------------------------------------------------------
    def _may_bucket(self) -> bool:
        """Whether a bucket's flat tensor reduces as its members would one by one: no groups (the script's own
        grouping), a compression that works element by element, fusion on."""
        return (bool(self._requires_update) and self._groups is None
                and self._compression in (NoneCompressor, FP16Compressor)
                and runtime.active().settings.fusion_threshold > 0)

    def _form_buckets(self) -> None:
        """After this generation's first step: the buckets of the dense gradients, if every rank formed the same."""
        state = runtime.active()
        self._buckets_gen = state.gen
        params = [p for group in self.param_groups for p in group["params"]
                  if p in self._requires_update and p.grad is not None and not p.grad.is_sparse]
        ordered = params[::-1]  # backward produces the last layers' gradients first
        cap = min(BUCKET_BYTES, state.settings.fusion_threshold)
        slots = [Slot(i, p.numel() * p.element_size(), (p.dtype, p.device)) for i, p in enumerate(ordered)]
        formed = [[ordered[i] for i in members] for members in layout(slots, cap, min(FIRST_BUCKET_BYTES, cap))]
        names = [[str(self._parameter_names.get(p)) for p in members] for members in formed]
        mine = digest(names)
        every = allreduce(torch.tensor([mine, -mine], dtype=torch.int64), name="horovod_api.buckets", op=MAX,
                          process_set=self.process_set)
        if every.tolist() != [mine, -mine]:
            return  # the ranks formed different buckets: every gradient stays a request of its own
        for members, member_names in zip(formed, names, strict=True):
            if len(members) > 1:  # one gradient alone is reduced in place, without a copy
                bucket = Bucket(f"bucket.{member_names[0]}..{member_names[-1]}", members,
                                self.backward_passes_per_step)
                self._buckets.append(bucket)
                self._bucket_slots.update((id(p), (bucket, i)) for i, p in enumerate(members))
        bucketed = {id(p) for bucket in self._buckets for p in bucket.params}
        self._unbucketed = {p for p in self._requires_update if id(p) not in bucketed}
        if self._buckets and self._buckets[-1].params[-1] is ordered[-1]:
            # Backward's last bucket is complete when backward ends: its reduction starts then (_backward_ended), and
            # its gradients need no hook each; one stays, for Horovod's checks of the passes and of zero_grad().
            last = self._buckets[-1]
            last.hooked = False
            last.accumulators = [grad_accumulator(p) for p in last.params]
            for member in last.params[1:]:
                self._grad_accs.pop(id(member)).remove()

    def _drop_buckets(self) -> None:
        for bucket in self._buckets:
            if not bucket.hooked:
                for member in bucket.params[1:]:
                    self._grad_accs[id(member)] = member.register_post_accumulate_grad_hook(self._make_hook(member))
        self._buckets, self._bucket_slots = [], {}

    def _bucket_arrived(self, bucket: Bucket, index: int) -> None:
        # The hook of every gradient of every step: only list and attribute arithmetic here.
        delays = bucket.delays
        if delays[index] <= 0:
            raise AssertionError(TOO_MANY_PASSES)
        delays[index] -= 1
        if delays[index] == 0:
            if bucket.hooked:
                bucket.arrived += 1
                if bucket.arrived == len(delays):
                    self._keep(self._allreduce_bucket_async(bucket))
                    return
            elif all(map(torch._C._will_engine_execute_node, bucket.accumulators)):
                # This backward reaches every member (not a skipped branch, nor a checkpoint's inner backward that
                # leaves some to the outer one): all of their gradients are in when it ends.
                torch.autograd.Variable._execution_engine.queue_callback(partial(self._backward_ended, bucket))
        if bucket.name not in self._handles:
            self._keep(Reduction(bucket.name, (), bucket=bucket))  # begun

    def _backward_ended(self, bucket: Bucket) -> None:
        """The backward that reached every member of an unhooked bucket ended: its reduction starts (else step()
        starts it)."""
        begun = self._handles.get(bucket.name)
        if begun is not None and begun.wait is None and runtime.generation() == self._buckets_gen:
            self._keep(self._allreduce_bucket_async(bucket))

    def _allreduce_bucket_async(self, bucket: Bucket) -> Reduction:
        compressed, ctx = self._compression.compress(bucket.flat())
        prescale, postscale = self._scales()
        handle = _allreduce_async(compressed, compressed, bucket.name, self.op, prescale, postscale,
                                  self.process_set, checked=bucket.checked)
        bucket.checked = True
        return Reduction(bucket.name, (), partial(synchronize, handle), ctx, bucket=bucket)

    def _grouped_allreduce_grad_async(self, params: Tuple[torch.Tensor, ...]) -> Reduction:
        name = str(self._parameter_names.get(params[0]))
        compressed, ctxs = zip(*[self._compression.compress(p.grad) for p in params], strict=True)
        handle = grouped_allreduce_async_(list(compressed), name=name, op=self.op, process_set=self.process_set)
        return Reduction(name, params, partial(synchronize, handle), ctxs, grouped=True)

    def _keep(self, reduction: Reduction) -> None:
        self._handles[reduction.name] = reduction

    def _make_hook(self, p: torch.Tensor):
        key = id(p)  # a tensor's own hash is a Python call
        name = str(self._parameter_names.get(p))

        def hook(*unused: Any) -> None:
            slot = self._bucket_slots.get(key)
            if slot is not None:
                if runtime.generation() == self._buckets_gen:
                    self._bucket_arrived(*slot)
                    return
                self._drop_buckets()  # a new generation (elastic reset, init again): its first step is one by one
            begun = self._handles.get(name)
            if begun is not None and begun.wait is not None and self._allreduce_delay[p] <= 0:
                raise AssertionError(TOO_MANY_PASSES)
            assert p.grad is not None and not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] > 0:
                self._keep(Reduction(name, (p,)))  # begun
            elif self._groups is None:
                self._keep(self._allreduce_grad_async(p))
            else:
                self._group_arrived(p, name)
        return hook

    def _group_arrived(self, p: torch.Tensor, name: str) -> None:
        """`p`'s gradient is complete: its group's allreduce starts once all of the group's are."""
        group = self._p_to_group[p]
        self._group_counts[group] += 1
        if self._group_counts[group] < len(group):
            self._keep(Reduction(name, (p,)))  # begun
            return
        for member in group:
            self._handles.pop(str(self._parameter_names.get(member)), None)
        self._keep(self._grouped_allreduce_grad_async(group))
        self._group_counts[group] = 0

    def synchronize(self) -> None:
        """Wait for every gradient's allreduce (starting those backward did not start) and put the averages into
        `.grad`."""
        if not self.process_set.included():
            self._synchronized = True
            return
        if self._buckets and runtime.generation() != self._buckets_gen:
            self._drop_buckets()
        self._start_the_rest()
        try:
            for reduction in self._handles.values():
                self._land(reduction)
        finally:
            self._handles.clear()
            for bucket in self._buckets:
                bucket.restart(self.backward_passes_per_step)
        self._checked = True
        self._synchronized = True
        if self._buckets_gen != runtime.generation() and self._may_bucket():
            self._form_buckets()

    def _start_the_rest(self) -> None:
        """Start what backward did not: gradients not computed here (zeros), or not computed in every pass; groups
        some of whose gradients were not computed here; buckets some of whose gradients did not come."""
        asked = {p for r in self._handles.values() if r.bucket is None for p in r.params}
        missing = (self._unbucketed if self._buckets else self._requires_update) - asked
        if self._groups is not None:
            # A group some of whose gradients were not computed here: reduced as the group, with zeros for those, so
            # that its name matches the other ranks' (Horovod reduces them one by one under other names, and waits).
            for group in {self._p_to_group[p] for p in missing if p in self._p_to_group}:
                for member in group:
                    if member.grad is None:
                        member.grad = member.data.new(member.size()).zero_()
                    self._handles.pop(str(self._parameter_names.get(member)), None)
                self._keep(self._grouped_allreduce_grad_async(group))
                self._group_counts[group] = 0
                missing -= set(group)
        for p in missing:
            self._keep(self._allreduce_grad_async(p))
        for bucket in self._buckets:  # a bucket some of whose gradients did not come: zeros for those
            begun = self._handles.get(bucket.name)
            if begun is None or begun.wait is None:
                self._keep(self._allreduce_bucket_async(bucket))
        for begun in [r for r in self._handles.values() if r.wait is None]:
            self._keep(self._allreduce_grad_async(begun.params[0]))

    def _land(self, reduction: Reduction) -> None:
        """Wait for one reduction and put its result into the gradients."""
        assert reduction.wait is not None
        output = reduction.wait()
        decompress = self._compression.decompress
        if reduction.bucket is not None:
            reduction.bucket.scatter(decompress(output, reduction.ctx))
            return
        for member in reduction.params:
            self._allreduce_delay[member] = self.backward_passes_per_step
        if self._groups is not None:
            self._group_counts[self._p_to_group[reduction.params[0]]] = 0
        parts = output if reduction.grouped else [output]
        ctxs = reduction.ctx if reduction.grouped else [reduction.ctx]
        for member, part, ctx in zip(reduction.params, parts, ctxs, strict=True):
            grad = member.grad
            assert grad is not None  # (every gradient reduced was computed, or zeros stood in)
            if not grad.is_sparse:
                grad.set_(decompress(part, ctx))
                continue
            aggregated = decompress(part, ctx)
            grad.zero_().add_(aggregated if aggregated.is_sparse else aggregated.to_sparse())

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within, step() does not synchronize (after an explicit synchronize(), e.g. to clip gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                              "your code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def _horovod_api_local_step(self) -> Any:
        """The wrapped optimizer's own step, without allreduces (broadcast_optimizer_state's zero step)."""
        return super().step()

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                                 "or optimizer.synchronize(). This is prohibited as it can cause a race condition.")
        return super().zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1, op: int = AVERAGE,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
                         sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set) -> torch.optim.Optimizer:
    """`optimizer` whose gradients are averaged (op) over the process set before each step, with Horovod's options:
    named_parameters (names of the allreduces, and checked for duplicates and gaps), compression,
    backward_passes_per_step (gradients accumulate locally in between), gradient_predivide_factor (the average split
    as 1/f before the sum and f/size after), groups (parameters reduced together), sparse_as_dense."""
    if gradient_predivide_factor != 1.0 and op != AVERAGE:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == ADASUM and runtime.size() > 1:
        raise NotImplementedError(ADASUM_REFUSED)
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
