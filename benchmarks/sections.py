"""The generated parts of BENCHMARKS.md: each block turns committed result files (benchmarks/results/)
into markdown, says which file every number came from, and says so when a file is not there yet.

A block is called as `{{name FILE [FILE...] [OPTION]}}` from the template (benchmarks.render); FILE is
relative to the results folder."""

from __future__ import annotations

from typing import Callable, Dict, List

from common.compare import tables
from common.compare.analysis import FLOOR_MARGIN as DEFAULT_MARGIN
from common.compare.floor import DEFAULT_FLOOR_RUNS as DEFAULT_RUNS

from .allreduce_tables import allreduce_algorithms, allreduce_limit, allreduce_table
from .formatting import failures, framed, met, ms, rounded, spread_cell, when
from .result_files import MISSING_FILE, Results
from .stale import run_all_steps, status
from .targets import target, targets
from .throughput_tables import data_wait_table, sweep_table, throughput_table


# ---- machines ----

def machine_line(m: Dict) -> str:
    """One machine in words."""
    v = m.get("versions") or {}
    parts = [f"{m.get('cpu_model')} (model name in `/proc/cpuinfo`)", f"{m.get('cores')} cores",
             f"{m.get('memory_gib')} GiB", ", ".join(m.get("gpus") or []) or "no GPU"]
    software = [v.get("platform"), f"Python {v.get('python')}", f"torch {v.get('torch')}",
                f"torchvision {v.get('torchvision')}", f"Horovod {v.get('horovod')}"]
    if v.get("mpi"):
        software.append(v["mpi"])
    return ", ".join(parts) + "; " + ", ".join(s for s in software if s)


def machines(results: Results) -> str:
    """The machines the results ran on, and when and under what load each result was measured."""
    files = results.all_files()
    described: Dict[str, List[str]] = {}
    for name in files:
        described.setdefault(machine_line(results.get(name)["machine"]), []).append(name)
    lines = []
    for line, names in described.items():
        which = "every result below" if len(described) == 1 else ", ".join(f"`{n}`" for n in names)
        lines.append(f"- {line} ({which}).")
    rows = []
    steps = run_all_steps()
    for name in files:
        r = results.get(name)
        revision = (r["machine"].get("versions") or {}).get("project_git")
        now = status(name, r, steps)
        busy = r.get("cpu_busy_before")
        rows.append([f"`{results.path(name)}`", when(r), tables.MISSING if busy is None else f"{busy:.0%}",
                     (r.get("load_before") or {}).get("1m", tables.MISSING),
                     "yes" if r.get("under_load") else "no",
                     revision[:12] + ("-dirty" if revision.endswith("-dirty") else "") if revision else tables.MISSING,
                     "yes" if now.current else f"no: {now.reason}"])
    return "\n".join(lines) + "\n\n" + tables.markdown(
        ["result", "measured (UTC)", "CPU busy before", "1-minute load before", "under_load", "git revision",
         "current"], rows)


# ---- loop overhead, comm hook, Horovod's cycle ----

def loop_overhead_table(results: Results, name: str) -> str:
    """µs per step of each piece of bookkeeping, and its share of the step, per model."""

    def body() -> str:
        result = results.get(name)
        models = result["rows"]
        pieces = list(dict.fromkeys(p for m in models for p in m["costs_s"]))
        headers = ["piece"]
        for m in models:
            headers += [f"{m['model']} {m['image_size']}x{m['image_size']}: µs per step",
                        f"share of its step ({ms(m['step_s'])})"]
        rows = []
        for piece in pieces:
            row = [piece]
            for m in models:
                cost = m["costs_s"].get(piece)
                row += ([rounded(cost * 1e6, 2), tables.percent(cost / m["step_s"], ".3f")] if cost is not None
                        else [tables.MISSING, tables.MISSING])
            rows.append(row)
        total = ["**total**"]
        for m in models:
            total += [f"**{rounded(m['total_s'] * 1e6, 3)}**", f"**{tables.percent(m['share_of_step'], '.3f')}**"]
        rows.append(total)
        m = models[0]
        return f"One thread, per-rank batch {m['batch_size']}.\n\n" + tables.markdown(headers, rows)

    return framed(results, [name], body)


def ddp_comm_hook_table(results: Results, name: str) -> str:
    """Built-in allreduce against the timing comm hook, ms per step, one row per job."""

    def body() -> str:
        result = results.get(name)
        st = result["settings"]
        rows = [[r["run"], f"{r['builtin_ms']:.2f}", f"{r['python_hook_ms']:.2f}", f"{100 * r['hook_cost']:+.1f}%"]
                for r in result["rows"]]
        return (f"{st['model']} {st['image_size']}x{st['image_size']}, per-rank batch {st['batch_size']}, world size "
                f"{st['world_size']}, one thread per rank; median ms per step of the slowest rank:\n\n"
                + tables.markdown(["job", "built-in allreduce ms", "Python comm hook ms", "hook − built-in"], rows)
                + failures(result))

    return framed(results, [name], body)


def probe_cost_table(results: Results, name: str) -> str:
    """A user's DDP script bare and under the probe, samples/s per job and the cost, against the target."""

    def body() -> str:
        result = results.get(name)
        st = result["settings"]
        rows = [[f"{r['model']} {r['image_size']}x{r['image_size']}",
                 " ".join(f"{v:.1f}" for v in r["bare_samples_per_s"]),
                 " ".join(f"{v:.1f}" for v in r["probed_samples_per_s"]),
                 tables.MISSING if r["cost"] is None else f"{100 * r['cost']:+.1f}%"] for r in result["rows"]]
        return (f"World size {st['world_size']} under {st['launcher']}, per-rank batch {st['batch_size']}, "
                f"{st['threads']} thread per rank, {st['steps']} steps per job (the first 2 untimed), {st['repeats']} "
                f"jobs of each kind, alternating; the target is a cost of at most "
                f"{target('probe_cost')} at resnet18 224x224:\n\n"
                + tables.markdown(["model", "bare samples/s (each job)", "under the probe (each job)",
                                   "cost (medians)"], rows)
                + failures(result))

    return framed(results, [name], body)


def horovod_cycle_table(results: Results, name: str) -> str:
    """Idle CPU of an initialised Horovod rank and the compute slowdown beside it, per controller and cycle."""

    def body() -> str:
        result = results.get(name)
        rows = []
        for r in result["rows"]:
            per_rank = " / ".join(f"{100 * x:.0f}" for x in r["idle_cpu_per_s"])
            yielding = {"1": "yields", "0": "busy-polls"}.get(r.get("mpi_yield_when_idle"), tables.MISSING)
            rows.append([r["controller"], f"{r['cycle_time_ms']:g} ms", f"{100 * r['idle_cpu_mean']:.0f} ({per_rank})",
                         f"{100 * r['compute_slowdown']:+.0f}%", yielding if r["controller"] == "mpi" else ""])
        return tables.markdown(["controller", "HOROVOD_CYCLE_TIME", "idle CPU per rank, % of a core: mean (each rank)",
                                "compute slowdown", "Open MPI when idle"], rows)

    return framed(results, [name], body)


def stop_latency_table(results: Results, name: str) -> str:
    """Seconds from a Ctrl-C to the last rank's and the launcher's exit, per launcher, against the bound."""

    def body() -> str:
        result = results.get(name)
        st = result["settings"]
        rows = [[r["launcher"], f"{r['step_s']:.1f}", tables.number(r["ranks_exit_s"], ".1f"),
                 f"{r['launcher_exit_s']:.1f}", f"{r['bound_s']:.1f}", met(r["within_bound"]),
                 f"step {r['stopped_step']}" if r["checkpoint_written"] else "**none**", str(r["exit_code"])]
                for r in result["rows"]]
        return (f"{st['np']} ranks, `{' '.join(st['train_args'])}`; SIGINT to the launcher's process group after "
                f"{st['steps_before']} steps; bound {st['bound']}:\n\n"
                + tables.markdown(["launcher", "longest step s", "last rank gone s", "launcher gone s", "bound s",
                                   "within", "final checkpoint", "exit code"], rows)
                + failures(result))

    return framed(results, [name], body)


def _grid_row(g: Dict) -> List[str]:
    return [g["floor_runs"], f"{g['margin']:g}", f"{len(g['false_alarms'])} of {g['same']}",
            f"{len(g['misses'])} of {g['real']}", ", ".join(g["false_alarms"] + g["misses"]) or "–"]


def verdicts_tables(results: Results, name: str) -> str:
    """The verdict corpus: false alarms and misses per floor size and margin, then every pair at the defaults."""

    def body() -> str:
        result = results.get(name)
        st = result["settings"]
        grid = tables.markdown(["disturbed runs in the floor", "margin", "false alarms", "misses", "wrong"],
                               [_grid_row(g) for g in result["grid"]])
        key = f"{DEFAULT_RUNS}@{DEFAULT_MARGIN:g}"
        rows = []
        for case in result["cases"]:
            judged = case["judged"].get(key) or {}
            largest = judged.get("largest_band_ratio") or {}
            branched = ", ".join(f"{q} at {step}" for q, step in sorted((judged.get("branches") or {}).items()))
            rows.append([case["name"], case["what"], case["setting"],
                         "same training" if case["kind"] == "same" else f"differs from step {case['expected_step']}",
                         tables.number(largest.get("ratio"), ".3g"), branched or "–",
                         judged.get("trains_differently_from") or "–", "yes" if judged.get("correct") else "**no**"])
        pairs = tables.markdown(["pair", "the Horovod side (or second run)", "setting", "truth",
                                 "largest gap / floor", "judged from its branch", "judged beyond from step", "right"],
                                rows)
        return (f"{len(result['cases'])} pairs ({sum(c['kind'] == 'same' for c in result['cases'])} same-training, "
                f"{sum(c['kind'] == 'real' for c in result['cases'])} with one real difference), each judged by "
                "the comparison's own code against floors of 1 to "
                f"{st['max_floor']} disturbed runs of its setting, at margins {', '.join(f'{m:g}' for m in st['margins'])}:"
                f"\n\n{grid}\n\nEvery pair at the defaults ({DEFAULT_RUNS} disturbed runs, margin "
                f"{DEFAULT_MARGIN:g}):\n\n{pairs}" + failures(result))

    return framed(results, [name], body)


def counted(n: int, word: str, plural: str = "") -> str:
    """'1 false alarm', '2 false alarms': n and the word in the number it takes."""
    return f"{n} {word if n == 1 else plural or word + 's'}"


def verdicts_sentence(results: Results, name: str) -> str:
    """The corpus in a few sentences, as docs/comparing.md quotes it (tests/test_docs.py checks)."""
    result = results.get(name)
    if result is None:
        return MISSING_FILE.format(path=results.path(name))
    at = {(g["floor_runs"], g["margin"]): g for g in result["grid"]}
    default = at[(DEFAULT_RUNS, DEFAULT_MARGIN)]
    key = f"{DEFAULT_RUNS}@{DEFAULT_MARGIN:g}"

    def ratio(case: Dict, where: str = key) -> float:
        return (case["judged"][where].get("largest_band_ratio") or {}).get("ratio") or 0.0

    def departed(case: Dict) -> float:
        """How far a real difference is beyond the floor at the step it is judged beyond from."""
        return case["judged"][key].get("departure_ratio") or 0.0

    same = [c for c in result["cases"] if c["kind"] == "same"]
    real = [c for c in result["cases"] if c["kind"] == "real"]
    by_lr = [c for c in real if ratio(c) <= DEFAULT_MARGIN and c["judged"][key]["correct"]]

    def alarms_of(grid_cell: Dict, where: str) -> tuple:
        """The same-training pairs called beyond, and how they read: ' (name, Nx what rounding gives; ...)' or ''."""
        alarms = [c for c in same if c["name"] in grid_cell["false_alarms"]]
        read = [f"{c['name']}, {ratio(c, where):,.0f}x what rounding gives" for c in alarms]
        return alarms, (" (" + "; ".join(read) + ")" if alarms else "")

    alarms, shown = alarms_of(default, key)
    quiet = [c for c in same if c not in alarms]
    text = (f"On {counted(len(same), 'same-training pair')} and {counted(len(real), 'pair')} with one real difference, "
            f"{DEFAULT_RUNS} disturbed runs at margin {DEFAULT_MARGIN:g} give "
            f"{counted(len(alarms), 'false alarm')}{shown} and {counted(len(default['misses']), 'miss', 'misses')}: "
            f"no {'other ' if alarms else ''}same-training pair comes above {max(ratio(c) for c in quiet):.2g}x what "
            f"rounding gives, and every real difference is called beyond it from the step it first acts, leaving it "
            f"by at least {min(departed(c) for c in real if c not in by_lr):,.0f}x")
    if by_lr:
        text += (" or differs in its learning rate (" + ", ".join(f"{c['name']}, {ratio(c):.2g}x" for c in by_lr)
                 + ")")
    one = at.get((1, DEFAULT_MARGIN))
    if one is not None and DEFAULT_RUNS != 1:
        _, shown = alarms_of(one, f"1@{DEFAULT_MARGIN:g}")
        text += (f". One disturbed run gives {counted(len(one['false_alarms']), 'false alarm')}{shown} and "
                 f"{counted(len(one['misses']), 'miss', 'misses')}")
    return text + "."


def exact_cost_tables(results: Results, name: str) -> str:
    """--reduction exact against allreduce: speed and bytes per step, fixed-point error, distance after a run."""

    def body() -> str:
        result = results.get(name)
        st = result["settings"]
        speed = {(r["model"], r["world_size"], r["mode"]): r for r in result["speed"]}
        paired = {(c["model"], c["world_size"]): c.get("per_repeat") for c in result.get("cost", [])}
        rows = []
        for model, np in sorted({(m, n) for m, n, _ in speed}):
            a, e = speed.get((model, np, "allreduce")), speed.get((model, np, "exact"))
            ratio = (a["samples_per_s"]["median"] / e["samples_per_s"]["median"]) if a and e else None
            per_repeat = paired.get((model, np))
            rows.append([f"{model} {st['image_sizes'][model]}x{st['image_sizes'][model]}", np,
                         spread_cell(a["samples_per_s"]) if a else tables.MISSING,
                         spread_cell(e["samples_per_s"]) if e else tables.MISSING,
                         f"{ratio:.2f}x" if ratio else tables.MISSING,
                         (f"{per_repeat['min']:.2f}–{per_repeat['max']:.2f}x" if per_repeat else tables.MISSING),
                         *(tables.measured(m["comm_ms"]["median"], m["comm_ms"]["min"], m["comm_ms"]["max"])
                           if m and m.get("comm_ms") else tables.MISSING for m in (a, e)),
                         tables.size(a["bytes_per_step"]) if a else tables.MISSING,
                         tables.size(e["bytes_per_step"]) if e else tables.MISSING])
        if "threads" in st:  # both modes on the same micro-batches, the same threads
            how = (f"both modes on micro-batches of {st['micro_batch']} (allreduce mode: per-rank batches of "
                   f"{st['micro_batch']}, accumulated), {st['threads']} thread(s) per rank")
        else:
            how = (f"exact micro-batch {st['micro_batch']}, allreduce mode on whole per-rank batches; each mode "
                   "with its default threads")
        text = (f"{st['launcher']}, global batch {st['global_batch']} in both modes, {how}, {st['steps']} steps, "
                f"median (min–max) over {st['repeats']} repeats:\n\n"
                + tables.markdown(["model", "np", "allreduce samples/s", "exact samples/s",
                                   "exact step time / allreduce's", "per repeat (the two runs side by side)",
                                   "allreduce exposed comm ms/step", "exact exposed comm ms/step",
                                   "allreduce bytes/step", "exact bytes/step"], rows))
        errors = [[e["model"], e["micro_batches"], f"{e['fixed_point']:.1e}", f"{e['float32_sum']:.1e}"]
                  for e in result["fixed_point_error"]]
        text += ("\n\nLargest error of the mean gradient over the micro-batches, relative to each tensor's largest "
                 "gradient, against float64:\n\n"
                 + tables.markdown(["model", "micro-batches", "fixed point (exact mode)", "float32, summed in order"],
                                   errors))
        far = result.get("distance")
        if far:
            scores = ", ".join(f"{mode} {top1:.4f}" for mode, top1 in far["val_top1"].items())
            text += (f"\n\nAfter a full default run in each mode at {far['world_size']} ranks (settings: "
                     f"{far['settings']}), the two modes' weights differ by at most {far['max_abs_weight_diff']:.2e} (largest weight "
                     f"{far['largest_weight']:.2f}); val top-1: {scores}.")
        return text + failures(result)

    return framed(results, [name], body)


#: placeholder name -> block
BLOCKS: Dict[str, Callable[..., str]] = {
    "machines": machines,
    "targets": targets,
    "target": lambda results, name: target(name),
    "allreduce_limit": allreduce_limit,
    "allreduce_table": allreduce_table,
    "allreduce_algorithms": allreduce_algorithms,
    "throughput_table": throughput_table,
    "sweep_table": sweep_table,
    "data_wait_table": data_wait_table,
    "loop_overhead_table": loop_overhead_table,
    "ddp_comm_hook_table": ddp_comm_hook_table,
    "probe_cost_table": probe_cost_table,
    "horovod_cycle_table": horovod_cycle_table,
    "stop_latency_table": stop_latency_table,
    "verdicts_tables": verdicts_tables,
    "exact_cost_tables": exact_cost_tables,
}
