"""What each result looks like: one function per benchmark turns its JSON into markdown (SECTIONS), framed alike in
BENCHMARKS.md by the command that wrote it, its failed runs and where the numbers come from. A new benchmark's result
gets its section from one function here and one `{{FILE}}` placeholder in the template; `publish` prints it too."""

from __future__ import annotations

import json
import math
import re
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from common.compare import tables
from common.compare.analysis import FLOOR_MARGIN
from common.compare.arguments import byte_size
from common.compare.conditions import conditions
from common.compare.floor import DEFAULT_FLOOR_RUNS
from common.compare.stats import split_key

Result = dict[str, Any]
MISSING, table, size, number, percent = tables.MISSING, tables.markdown, tables.size, tables.number, tables.percent
NAMES = {"torch-gloo": "torch gloo", "horovod-gloo": "Horovod/Gloo", "horovod-mpi": "Horovod/MPI", "ddp": "DDP",
         "mpi": "Open MPI alone", "bare-ddp": "bare DDP (seed)", "bare-ddp-batched": "bare DDP (batched)",
         "independent": "independent N x 1", "api": "the Horovod API (torchrun)",
         "api-cache-off": "the API, HOROVOD_CACHE_CAPACITY=0", "port": "the plain DDP port"}
RUN_ORDER = ["bare-ddp", "bare-ddp-batched", "ddp", "horovod-gloo", "horovod-mpi", "independent"]
#: swept knob -> (backend_options field with the value a run used, field saying who chose it, unit)
KNOB_RECORDS = {"HOROVOD_CYCLE_TIME": ("cycle_time_ms", "cycle_time_source", " ms"),
                "OMPI_MCA_mpi_yield_when_idle": ("mpi_yield_when_idle", "mpi_yield_source", ""),
                "deterministic": ("fusion_threshold_bytes", "", " B fusion threshold"),
                "HVD_TRAIN_WAIT": ("wait", "wait_source", "")}
#: how a test of Horovod's suite can end, in the order the tables give them
ENDS = ("passed", "failed", "error", "skipped", "hung", "crashed", "not run")
#: Horovod's examples run on the API alone, at 2 ranks
API_EXAMPLES = ("pytorch_synthetic_benchmark", "pytorch_imagenet_resnet50", "pytorch_mnist_elastic")
#: the folders of a path in a test's message (`.../torch/optim/_muon.py:134` -> `_muon.py:134`)
FOLDERS = re.compile(r"(?:/[^\s/:]+)+/")


class Results:
    """The result files under one folder, each read once, named as the document names them."""

    def __init__(self, folder: Path, shown_as: str = "benchmarks/results") -> None:
        self.folder, self.shown_as = Path(folder), shown_as
        self._read: dict[str, Result | None] = {}

    def path(self, file: str) -> str:
        return f"{self.shown_as}/{file}"

    def get(self, file: str) -> Result | None:
        """The parsed result, None when the file does not exist; ValueError when it is not JSON."""
        if file not in self._read:
            found = self.folder / file
            try:
                self._read[file] = json.loads(found.read_text()) if found.is_file() else None
            except ValueError as exc:
                raise ValueError(f"{found} is not JSON ({exc}); run its step of benchmarks/run_all.sh again") from None
        return self._read[file]

    def all_files(self) -> list[str]:
        """Every benchmark result in the folder (JSON with a "benchmark" field), sorted."""
        files = sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*.json"))
        return [f for f in files if "benchmark" in (self.get(f) or {})]

    def missing(self, file: str = "") -> str:
        """The note that stands where a result is not there yet."""
        return f"_Not measured yet: `benchmarks/run_all.sh` writes {f'`{self.path(file)}`' if file else 'them'}._"


def rounded(value: float | None, digits: int = 3) -> str:
    """`digits` significant digits without an exponent: 2162.8 -> "2163", 15.43 -> "15.4", 0.1362 -> "0.136"."""
    if value is None or not math.isfinite(value):
        return MISSING
    return "0" if value == 0 else f"{value:.{max(0, digits - 1 - math.floor(math.log10(abs(value))))}f}"


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds, two significant digits: "0.14 ms", "15 ms"."""
    return MISSING if seconds is None else f"{rounded(seconds * 1e3, 2)} ms"


def spread_cell(cell: dict[str, float] | None) -> str:
    """A median with its range, three significant digits: "1361 (1227–1632)"."""
    if not cell:
        return MISSING
    decimals = max(0, 2 - math.floor(math.log10(abs(cell["median"])))) if cell["median"] else 0
    return tables.measured(cell["median"], cell["min"], cell["max"], f".{decimals}f")


def met(ok: bool | None) -> str:
    return "not measured" if ok is None else "yes" if ok else "no"


def name(label: str) -> str:
    return NAMES.get(label, label)


def square(model: str, side: int) -> str:
    """A model at an image size: "resnet18 224x224"."""
    return f"{model} {side}x{side}"


def setting(case: Result) -> str:
    """What a throughput case set: "no knob set", "HOROVOD_CYCLE_TIME unset (auto)", "HOROVOD_CYCLE_TIME=5"."""
    if case.get("knob") is None:
        return "no knob set"
    return f"{case['knob']} unset (auto)" if case["value"] == "auto" else f"{case['knob']}={case['value']}"


def row_at(series: Result, nbytes: int) -> Result | None:
    """An allreduce series' row at `nbytes`, None when it was not measured."""
    return next((r for r in series["results"] if r["bytes"] == nbytes), None)


def _allreduce_cell(row: Result | None) -> str:
    """Time per allreduce; from 1 MB up also busbw and its share of the limit."""
    if row is None or row["bytes"] < 2**20:
        return ms(row["time_s"]) if row else MISSING
    return f"{ms(row['time_s'])}, {rounded(row['busbw_GBps'], 2)} GB/s ({100 * row['busbw_of_limit']:.0f}%)"


def allreduce(ar: Result, sizes: str = "") -> str:
    """The limit and the copy/add floor in words, then time per allreduce (and busbw) by size, one column per series
    (`sizes` picks rows: "4,4K,1M"), or one row per algorithm when Open MPI's was chosen."""
    c, floor, series = ar["memcpy"], ar["floor"], ar["series"]
    largest = max((r["bytes"] for s in series for r in s["results"]), default=0)
    text = (f"Memory-copy limit: {c['limit_GBps']:.1f} GB/s ({c['limit']}; one thread {c['cpu_1thread_GBps']:.1f} "
            f"GB/s, all cores {c['cpu_all_cores_GBps']:.1f} GB/s). Copy/add floor: one thread copies "
            f"{floor['copy_GBps']:.1f} GB/s and adds {floor['add_GBps']:.1f} GB/s on {size(floor['bytes'])} buffers, "
            f"so a copy-based ring allreduce reaches at most {floor['busbw_GBps']:.1f} GB/s busbw, "
            f"{100 * floor['of_limit']:.0f}% of the limit (at least {ms(largest / floor['busbw_GBps'] / 1e9)} for "
            f"{size(largest)} at world size 2).\n\n")
    column = {id(s): f"{name(s['name'])} x{s['world_size']}" for s in series}
    columns = list(dict.fromkeys(column.values()))
    if any(s.get("mpi_algorithm") for s in series):
        cells = {(s.get("mpi_algorithm") or "default", column[id(s)]): row_at(s, largest) for s in series}
        rows = [[a] + [_allreduce_cell(cells.get((a, col))) for col in columns]
                for a in dict.fromkeys(a for a, _ in cells)]
        return text + f"At {size(largest)}:\n\n" + table(["algorithm", *columns], rows)
    shown = [b for b in sorted({r["bytes"] for s in series for r in s["results"]})
             if not sizes or b in {byte_size(s) for s in sizes.split(",")}]
    return text + table(["size", *columns],
                        [[size(b)] + [_allreduce_cell(row_at(s, b)) for s in series] for b in shown])


def _knob_used(case: Result, knob: str) -> str:
    """The value of `knob` the runs of `case` used, and who chose it, from their backend_options."""
    field, source, unit = KNOB_RECORDS.get(knob, ("", "", ""))
    options = next((o for r in case["runs"] for o in [r.get("backend_options") or {}] if o.get(field) is not None), {})
    value = options.get(field)
    shown = MISSING if value is None else f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"
    return f"{shown} ({options[source]})" if options.get(source) else shown


def throughput(tp: Result) -> str:
    """Every cell of a throughput result: samples/s, scaling, exchange overhead, both loop ratios and the time split
    per case, run and world size; for a sweep, the setting and the value the runs used. Empty columns are left out."""
    st, knob = tp["settings"], next((c["knob"] for c in tp["cases"] if c.get("knob")), "")
    rows = []
    for case in tp["cases"]:
        keys = sorted(case["throughput"], key=lambda key: (
            split_key(key)[1], RUN_ORDER.index(split_key(key)[0]) if split_key(key)[0] in RUN_ORDER else 99))
        for i, key in enumerate(keys):
            (label, world), split, n = split_key(key), case["time_split"].get(key) or {}, str(key.split("@")[1])
            what = square(case["model"], case["image_size"]) + (f", {setting(case)}" if knob else "")
            rows.append([what if i == 0 else "", (_knob_used(case, knob) if knob else "") if i == 0 else "",
                         name(label), world, spread_cell(case["throughput"][key]),
                         number(case["scaling_efficiency"].get(label, {}).get(n), ".2f"),
                         percent(case["exchange_overhead"].get(label, {}).get(n)),
                         *(number(case[r].get(n) if label == "ddp" else None, ".2f")
                           for r in ("loop_ratio", "loop_ratio_batched")),
                         rounded(split.get("comm_ms"), 2), rounded(split.get("step_ms"), 3),
                         percent(split.get("data_frac")), number(case["throughput"][key]["job_cpu_s"], ".0f")])
    headers = ["case", f"{knob} used", "run", "world size", "samples/s", "scaling eff.", "exchange overhead",
               "loop / bare (seed)", "loop / bare (batched)", "comm ms/step", "step ms", "data %", "job CPU s"]
    kept = [i for i in range(len(headers)) if any(row[i] not in ("", MISSING) for row in rows)]
    steps = sorted(set(st["steps"].values()))
    extra = f", every run with `{' '.join(st['extra_train_args'])}`" if st["extra_train_args"] else ""
    return (f"{st['dataset'].capitalize()} data, per-rank batch {st['batch_size']}, "
            + (str(steps[0]) if len(steps) == 1 else ", ".join(f"{k} ({m})" for m, k in st["steps"].items()))
            + f" steps per run (the first not timed), median (min–max) of {st['repeats']} repeat(s){extra}.\n\n"
            + table([headers[i] for i in kept], [[row[i] for i in kept] for row in rows]))


def loop_overhead(result: Result) -> str:
    """µs per step of each piece of bookkeeping, and its share of the step, per model."""
    models = result["rows"]
    pieces = dict.fromkeys(p for m in models for p in m["costs_s"])
    headers = ["piece", *(h for m in models for h in (f"{square(m['model'], m['image_size'])}: µs per step",
                                                      f"share of its step ({ms(m['step_s'])})"))]
    rows = [[piece, *(c for m in models for c in ((rounded(m["costs_s"][piece] * 1e6, 2), percent(
        m["costs_s"][piece] / m["step_s"], ".3f")) if piece in m["costs_s"] else (MISSING, MISSING)))]
            for piece in pieces]
    rows.append(["**total**", *(c for m in models for c in (f"**{rounded(m['total_s'] * 1e6, 3)}**",
                                                             f"**{percent(m['share_of_step'], '.3f')}**"))])
    return f"One thread, per-rank batch {models[0]['batch_size']}.\n\n" + table(headers, rows)


def ddp_comm_hook(result: Result) -> str:
    """Built-in allreduce against the timing comm hook, ms per step, one row per job."""
    st = result["settings"]
    return (f"{square(st['model'], st['image_size'])}, per-rank batch {st['batch_size']}, world size "
            f"{st['world_size']}, one thread per rank; median ms per step of the slowest rank:\n\n"
            + table(["job", "built-in allreduce ms", "Python comm hook ms", "hook − built-in"],
                    [[r["run"], f"{r['builtin_ms']:.2f}", f"{r['python_hook_ms']:.2f}", f"{100 * r['hook_cost']:+.1f}%"]
                     for r in result["rows"]]))


def probe_cost(result: Result) -> str:
    """A user's DDP script bare and under the probe, samples/s per job and the cost."""
    st = result["settings"]
    rows = [[square(r["model"], r["image_size"]), *(" ".join(f"{v:.1f}" for v in r[k]) for k in (
        "bare_samples_per_s", "probed_samples_per_s")), MISSING if r["cost"] is None else f"{100 * r['cost']:+.1f}%"]
            for r in result["rows"]]
    return (f"World size {st['world_size']} under {st['launcher']}, per-rank batch {st['batch_size']}, {st['threads']} "
            f"thread per rank, {st['steps']} steps per job (the first 2 untimed), {st['repeats']} jobs of each kind, "
            "alternating:\n\n" + table(["model", "bare samples/s (each job)", "under the probe (each job)",
                                        "cost (medians)"], rows))


def horovod_cycle(result: Result) -> str:
    """Idle CPU of an initialised Horovod rank and the compute slowdown beside it, per controller and cycle."""
    return table(["controller", "HOROVOD_CYCLE_TIME", "idle CPU per rank, % of a core: mean (each rank)",
                  "compute slowdown", "Open MPI when idle"],
                 [[r["controller"], f"{r['cycle_time_ms']:g} ms",
                   f"{100 * r['idle_cpu_mean']:.0f} ({' / '.join(f'{100 * x:.0f}' for x in r['idle_cpu_per_s'])})",
                   f"{100 * r['compute_slowdown']:+.0f}%", "" if r["controller"] != "mpi" else
                   {"1": "yields", "0": "busy-polls"}.get(r.get("mpi_yield_when_idle"), MISSING)]
                  for r in result["rows"]])


def stop_latency(result: Result) -> str:
    """Seconds from a Ctrl-C to the last rank's and the launcher's exit, per launcher, against the bound."""
    st = result["settings"]
    rows = [[r["launcher"], f"{r['step_s']:.1f}", number(r["ranks_exit_s"], ".1f"), f"{r['launcher_exit_s']:.1f}",
             f"{r['bound_s']:.1f}", met(r["within_bound"]),
             f"step {r['stopped_step']}" if r["checkpoint_written"] else "**none**", str(r["exit_code"])]
            for r in result["rows"]]
    return (f"{st['np']} ranks, `{' '.join(st['train_args'])}`; SIGINT to the launcher's process group after "
            f"{st['steps_before']} steps; bound {st['bound']}:\n\n" + table(
                ["launcher", "longest step s", "last rank gone s", "launcher gone s", "bound s", "within",
                 "final checkpoint", "exit code"], rows))


def verdicts(result: Result) -> str:
    """The verdict corpus: false alarms and misses per floor size and margin, then every pair at the defaults."""
    st, cases, key = result["settings"], result["cases"], f"{DEFAULT_FLOOR_RUNS}@{FLOOR_MARGIN:g}"
    grid = [[g["floor_runs"], f"{g['margin']:g}", f"{len(g['false_alarms'])} of {g['same']}",
             f"{len(g['misses'])} of {g['real']}", ", ".join(g["false_alarms"] + g["misses"]) or "–"]
            for g in result["grid"]]
    rows = [[c["name"], c["what"], c["setting"],
             "same training" if c["kind"] == "same" else f"differs from step {c['expected_step']}",
             number((j.get("largest_band_ratio") or {}).get("ratio"), ".3g"),
             ", ".join(f"{q} at {step}" for q, step in sorted((j.get("branches") or {}).items())) or "–",
             j.get("trains_differently_from") or "–", "yes" if j.get("correct") else "**no**"]
            for c in cases for j in [c["judged"].get(key) or {}]]
    same = sum(c["kind"] == "same" for c in cases)
    return (f"{len(cases)} pairs ({same} same-training, {len(cases) - same} with one real difference), each judged by "
            f"the comparison's own code against floors of 1 to {st['max_floor']} disturbed runs of its setting, at "
            f"margins {', '.join(f'{m:g}' for m in st['margins'])}:\n\n"
            + table(["disturbed runs in the floor", "margin", "false alarms", "misses", "wrong"], grid)
            + f"\n\nEvery pair at the defaults ({DEFAULT_FLOOR_RUNS} disturbed runs, margin {FLOOR_MARGIN:g}):\n\n"
            + table(["pair", "the Horovod side (or second run)", "setting", "truth", "largest gap / floor",
                     "judged from its branch", "judged beyond from step", "right"], rows))


def exact_cost(result: Result) -> str:
    """--reduction exact against allreduce: speed and bytes per step, fixed-point error, distance after a run."""
    st, far = result["settings"], result.get("distance")
    speed = {(r["model"], r["world_size"], r["mode"]): r for r in result["speed"]}
    cost = {(c["model"], c["world_size"]): c for c in result["cost"]}
    rows = []
    for model, np in sorted({(m, n) for m, n, _ in speed}):
        a, e, c = speed.get((model, np, "allreduce")), speed.get((model, np, "exact")), cost.get((model, np))
        repeats = (c or {}).get("per_repeat")
        rows.append([square(model, st["image_sizes"][model]), np,
                     *(spread_cell(m["samples_per_s"]) if m else MISSING for m in (a, e)),
                     f"{c['step_time_ratio']:.2f}x" if c else MISSING,
                     f"{repeats['min']:.2f}–{repeats['max']:.2f}x" if repeats else MISSING,
                     *(tables.measured(m["comm_ms"]["median"], m["comm_ms"]["min"], m["comm_ms"]["max"])
                       if m and m.get("comm_ms") else MISSING for m in (a, e)),
                     *(size(m["bytes_per_step"]) if m else MISSING for m in (a, e))])
    errors = [[e["model"], e["micro_batches"], f"{e['fixed_point']:.1e}", f"{e['float32_sum']:.1e}"]
              for e in result["fixed_point_error"]]
    return (f"{st['launcher']}, global batch {st['global_batch']} in both modes, both modes on micro-batches of "
            f"{st['micro_batch']} (allreduce mode: per-rank batches of {st['micro_batch']}, accumulated), "
            f"{st['threads']} thread(s) per rank, {st['steps']} steps, median (min–max) over {st['repeats']} repeats:"
            "\n\n" + table(["model", "np", "allreduce samples/s", "exact samples/s", "exact step time / allreduce's",
                            "per repeat (the two runs side by side)", "allreduce exposed comm ms/step",
                            "exact exposed comm ms/step", "allreduce bytes/step", "exact bytes/step"], rows)
            + "\n\nLargest error of the mean gradient over the micro-batches, relative to each tensor's largest "
            "gradient, against float64:\n\n"
            + table(["model", "micro-batches", "fixed point (exact mode)", "float32, summed in order"], errors)
            + (f"\n\nAfter a full default run in each mode at {far['world_size']} ranks (settings: {far['settings']}), "
               f"the two modes' weights differ by at most {far['max_abs_weight_diff']:.2e} (largest weight "
               f"{far['largest_weight']:.2f}); val top-1: "
               + ", ".join(f"{mode} {top1:.4f}" for mode, top1 in far["val_top1"].items()) + "." if far else ""))


def horovod_api(result: Result) -> str:
    """Horovod's synthetic benchmark script on the project's Horovod API and on real Horovod: img/s per backend."""
    rows = [[name(label), f"{b['median']:.2f}", percent(b["spread"]), " ".join(f"{v:.2f}" for v in b["img_s"]),
             number(result["ratios"].get(f"api/{label}"), ".3f")] for label, b in result["backends"].items()]
    model = (square(result["model"], result["image_size"]) if result["image_size"] else
             "80 Linear(16, 16) layers (160 small gradient tensors)")
    return (f"{model}, batch {result['batch_size']}, {result['np']} ranks, "
            f"{result['threads_per_rank']} thread per rank, {result['repeats']} repeats:\n\n"
            + table(["backend", "img/s (median)", "spread (max/min − 1)", "each repeat", "the API's median / this"],
                    rows))


def horovod_suite(result: Result) -> str:
    """Horovod's own test suite (test_torch.py) per run and world size: how its tests ended; every test the API did
    not pass, with how it ended at each world size (paths cut to file names) and how real Horovod's runs of it
    ended; then its examples."""
    lines = []
    for test, runs in result["results"].items():
        api = {key: run for key, run in runs.items() if key.startswith("api@")}
        if all(run["outcome"] == "passed" for run in api.values()):
            continue
        ends = "; ".join(f"{key.split('@')[1]} ranks: {run['outcome']}" + (
            f" ({FOLDERS.sub('', run['message'])[:160]})" if run.get("message") else "")
            for key, run in sorted(api.items()))
        horovod = ", ".join(f"{name(key.split('@')[0])} at {key.split('@')[1]}: {run['outcome']}"
                            for key, run in sorted(runs.items()) if not key.startswith("api@"))
        lines.append(f"- `{test.split('::')[-1]}`: {ends}" + (f"; real Horovod: {horovod}" if horovod else ""))
    return (f"`{result['test_file']}` of Horovod at {str(result.get('horovod_revision'))[:12]}, {result['tests']} "
            f"tests, at most {result['test_timeout_s']:g} s each:\n\n"
            + table(["run", "ranks", *ENDS, "seconds", "launches"],
                    [[name(run["label"]), run["np"], *(run["counts"].get(end, 0) for end in ENDS),
                      f"{run['seconds']:.0f}", run["launches"]] for run in result["runs"]])
            + ("\n\nEvery test the API does not pass, as it ended:\n\n" + "\n".join(lines) if lines
               else "\n\nThe API passes every test at every world size.")
            + ("\n\n" + horovod_examples(result["examples"]) if result.get("examples") else ""))


def _ended(run: Result) -> str:
    """How an example's launch ended: 'ran (N s)', or its exit code or time-out."""
    if run.get("timed_out"):
        return "**timed out**"
    return f"ran ({run['seconds']:.0f} s)" if run.get("returncode") == 0 else f"**exit code {run.get('returncode')}**"


def _weights_text(weights: Result, missing: str, apart: str = "") -> str:
    """How two runs' final weights compare: 'bitwise equal', '‖Δ‖/‖w‖ X' (+ `apart`), or `missing`."""
    if not weights.get("compared"):
        return missing
    return "bitwise equal" if weights["bitwise_equal"] else f"‖Δ‖/‖w‖ {weights['relative_difference']:.2g}{apart}"


def _mnist_case(key: str, joined: str = ", ") -> str:
    """A pytorch_mnist.py case by its key: "2 ranks"; "3 ranks, HOROVOD_FUSION_THRESHOLD=0" for "3-fusion-off"."""
    ranks, _, fusion = key.partition("-")
    return f"{ranks} ranks" + (f"{joined}HOROVOD_FUSION_THRESHOLD=0" if fusion else "")


def horovod_examples(examples: Result) -> str:
    """Horovod's example scripts, unchanged: pytorch_mnist.py's final weights on the API against real Horovod (per
    world size, and at 3 ranks with fusion off), and the others on the API."""
    rows = [[f"pytorch_mnist.py, {_mnist_case(key)}", _ended(case.get("horovod-gloo", {})),
             _ended(case.get("api", {})), _weights_text(case.get("weights", {}), MISSING)]
            for key, case in examples.get("pytorch_mnist", {}).items()]
    rows += [[f"{script}.py, 2 ranks", "", _ended(examples[script]), ""] for script in API_EXAMPLES
             if script in examples]
    return "Horovod's examples, unchanged:\n\n" + table(
        ["script", "real Horovod (horovodrun --gloo)", "the API (torchrun)", "final weights"], rows)


def port_speed(result: Result) -> str:
    """Seconds `python -m ddp_train.port` takes on a script, against its target."""
    return (f"Median of {result['settings']['repeats']} runs of the command, each a process of its own:\n\n" + table(
        ["lines", "rewrite s", "whole command s", "target s", "met"],
        [[r["lines"], f"{r['rewrite_median_s']:.3f}", f"{r['command_median_s']:.3f}", f"< {result['target_s']:g}",
          met(r["command_median_s"] < result["target_s"])] for r in result["rows"]]))


def port_exit(result: Result) -> str:
    """How the runs of ported scripts ended: exit codes and aborts per script and ending, against no abort."""
    settings = result["settings"]
    endings = {"port": "as written", "no-end": "without its end"}
    return (f"{settings['runs']} runs of each at {settings['np']} ranks under torchrun, one after another:\n\n" + table(
        ["script", "the port", "runs", "exit codes (runs)", "aborted", "ended as meant", "no abort"],
        [[r["variant"], endings.get(r["ending"], r["ending"]), r["runs"],
          ", ".join(f"{code} ({n})" for code, n in sorted(r["exits"].items())), r["aborts"],
          f"{r['as_expected']} (exit {r['expected_exit']})",
          met(r["aborts"] <= result["target_aborts"]) if r["ending"] == "port" else ""] for r in result["rows"]]))


def negotiation(result: Result) -> str:
    """The Horovod API's negotiation per steady step on its three paths (cache off, the agreement, the guess),
    simulated and real."""
    rows = {(r["mode"], r["ranks"], r["tensors"], r["path"]): r for r in result["rows"]}

    def cell(mode: str, n: int, t: int, path: str, field: str, digits: int = 3) -> str:
        row = rows.get((mode, n, t, path))
        return MISSING if row is None or row.get(field) is None else f"{row[field]:,.{digits}f}"

    def under(n: int, t: int) -> str:
        cpu = [rows[key]["rank0_cpu_ms"] for key in (("simulated", n, t, "agreement"), ("simulated", n, t, "guess"))
               if key in rows]
        return met(max(cpu) <= result["target_rank0_ms"]) if t == 161 and cpu else ""

    simulated = sorted({(t, n) for mode, n, t, _ in rows if mode == "simulated"})
    real = sorted({(t, n) for mode, n, t, _ in rows if mode == "real"})
    parts = [f"Simulated with the engine's own state machine on every rank (median of the steady steps; the first "
             f"step apart). Rank 0's CPU with the cache on (agreement and guess) must stay under "
             f"{result['target_rank0_ms']:g} ms at every N for 161 tensors; rounds and bytes are what one rank waits "
             "on and sends for the negotiation in one steady step (the guess's flag travels in the sums' own "
             "allreduce):\n\n" + table(
                 ["tensors", "ranks", "rank 0 CPU ms: off", "agreement", "guess", "met", "rounds: off", "agreement",
                  "guess", "bytes per rank: off", "agreement", "guess", "allreduces: agreement", "guess",
                  "first step: rank 0 CPU ms, guess"],
                 [[t, n, *(cell("simulated", n, t, p, "rank0_cpu_ms") for p in ("off", "agreement", "guess")),
                   under(n, t), *(cell("simulated", n, t, p, "rounds", 0) for p in ("off", "agreement", "guess")),
                   *(cell("simulated", n, t, p, "bytes_per_rank", 0) for p in ("off", "agreement", "guess")),
                   *(cell("simulated", n, t, p, "collectives", 0) for p in ("agreement", "guess")),
                   cell("simulated", n, t, "guess", "first_rank0_cpu_ms", 1)] for t, n in simulated])]
    if real:
        parts.append("Real processes under torchrun on this machine, running the API itself (T allreduces of 16 "
                     "floats a step, then synchronize): the slowest rank's time per steady step, and rank 0's "
                     "engine's cycles per step that ran the agreement's collective and that the guess answered:\n\n"
                     + table(["tensors", "ranks", "wall ms: off", "agreement", "guess", "cycles agreed: agreement",
                              "guess", "cycles guessed: guess", "first step ms, guess"],
                             [[t, n, *(cell("real", n, t, p, "wall_ms") for p in ("off", "agreement", "guess")),
                               cell("real", n, t, "agreement", "agreed_cycles", 1),
                               cell("real", n, t, "guess", "agreed_cycles", 1),
                               cell("real", n, t, "guess", "guessed_cycles", 1),
                               cell("real", n, t, "guess", "first_wall_ms", 1)] for t, n in real]))
    return "\n\n".join(parts)


def engine_startup(result: Result) -> str:
    """Seconds from a Spark or Ray driver's call to the first training step and to the result, per number of workers,
    the first call and the next."""
    calls = {1: "first", 2: "next"}
    return (f"Median of {result['settings']['repeats']} drivers each, on the Horovod API:\n\n" + table(
        ["engine", "workers", "call", "engine start s", "to fn s", "to first step s", "to result s"],
        [[r["engine"], r["workers"], calls.get(r["call"], r["call"]), f"{r['engine_start_s']:.1f}",
          f"{r['to_fn_s']:.2f}", f"{r['to_first_step_s']:.2f}", f"{r['to_result_s']:.2f}"] for r in result["rows"]]))


#: link_speed's targets: a ratio of two cells' images/s at 1 Gbit/s, and the least it may be
LINK_TARGETS = {"api/port synthetic": ("synthetic-api", "synthetic-port"),
                "ddp_train/bare_ddp": ("loop-ddp_train", "loop-bare_ddp"),
                "hvd_train/horovod-gloo synthetic": ("loop-hvd_train", "synthetic-horovod-gloo")}
LINK_TARGET_RATIO, LINK_TARGET_LINK, FORECAST_TARGET = 0.95, "1gbit", 0.15


def link_targets(result: Result) -> list[list[str]]:
    """Each target's rows: the ratio of the medians, each repeat's ratio (the runs of a repeat ran side by side), and
    whether every repeat meets it (yes), none does (no), or they fall on both sides (undecided)."""
    rows = []
    for label, (top, bottom) in LINK_TARGETS.items():
        a = result["cells"].get(f"{top}-{LINK_TARGET_LINK}")
        b = result["cells"].get(f"{bottom}-{LINK_TARGET_LINK}")
        if not a or not b:
            continue
        repeats = [x / y for x, y in zip(a["img_s"], b["img_s"], strict=False) if y]  # (a failed run shortens one side)
        hits = [r >= LINK_TARGET_RATIO for r in repeats]
        verdict = "yes" if all(hits) else "no" if not any(hits) else "undecided"
        rows.append([f"{label}, {result['links'][LINK_TARGET_LINK]['shown']}", f">= {LINK_TARGET_RATIO}",
                     f"{a['median'] / b['median']:.3f}", " ".join(f"{r:.3f}" for r in repeats), verdict])
    return rows + forecast_targets(result)


def forecast_targets(result: Result) -> list[list[str]]:
    """The forecast's target, judged apart for the loops (the runs the report forecasts) and the scripts (their
    probed runs): the worst forecast of each against its measured step."""
    errors: dict[str, list[float]] = {"the loops": [], "the scripts": []}
    for tag, found in (result.get("forecasts") or {}).items():
        program = (result["cells"].get(tag) or {}).get("program", "loop")
        errors["the loops" if program == "loop" else "the scripts"].append(abs(found["error"]))
    return [[f"forecast against the measured step, {runs}, every link", f"within {FORECAST_TARGET:.0%}",
             f"at most {max(off):.0%} off", "–", "yes" if max(off) <= FORECAST_TARGET else "no"]
            for runs, off in errors.items() if off]


def milliseconds(ms: float) -> str:
    """A step time as the tables show it: whole milliseconds, tenths below 100."""
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}"


def link_speed(result: Result, *options: str) -> str:
    """Images/s per backend at every link setting (the median of the repeats; the share of exposed communication
    beside it, where the run recorded it), the ratios of the medians, the targets judged repeat by repeat, the
    forecasts, and the plot (unless `no-plot`)."""
    # unshaped first, then the fastest link to the slowest (the file keeps its keys sorted by name)
    links = sorted(result["links"], key=lambda link: -(result["links"][link]["rate_bits"] or math.inf))
    programs = sorted({c["program"] for c in result["cells"].values()}, key=lambda p: ("synthetic", "small-tensors",
                                                                                     "loop").index(p))
    parts = [f"2 ranks, one per host, 1 thread each; resnet18 at 224, batch {result['batch_size']} per rank, "
             f"{result['steps']} timed steps; median of {result['repeats']} interleaved repeats:"]

    def shown(cell: dict[str, Any] | None) -> str:
        if cell is None:
            return "–"
        share = f" ({100 * cell['comm_frac']:.0f}% exposed)" if cell.get("comm_frac") is not None else ""
        return f"{cell['median']:.1f}{share}"

    for program in programs:
        backends = sorted({c["backend"] for c in result["cells"].values() if c["program"] == program})
        parts.append(f"**{program}**, images/s:\n\n" + table(
            ["backend", *(result["links"][link]["shown"] for link in links)],
            [[backend, *(shown(result["cells"].get(f"{program}-{backend}-{link}")) for link in links)]
             for backend in backends]))
    ratios = [f"{name}: {value:.3f}" for name, value in result["ratios"].items() if value is not None]
    if ratios:
        parts.append("Ratios of the medians: " + "; ".join(ratios) + ".")
    found = result.get("forecasts") or {}
    if found:
        parts.append("The step time forecast from each cell's unshaped runs (common/compare/forecast.py; a script's "
                     "from its runs under the probe) against the "
                     "step measured at the shaped link:\n\n" + table(
                         ["run", "link", "forecast ms", "measured ms", "off by"],
                         [[f"{result['cells'][tag]['program']}: {result['cells'][tag]['backend']}",
                           result["links"][result["cells"][tag]["link"]]["shown"],
                           milliseconds(f["forecast_ms"]), milliseconds(f["measured_ms"]),
                           f"{100 * f['error']:+.0f}%"]
                          for tag, f in found.items()]))
    targets = link_targets(result)
    if targets:
        parts.append("The targets:\n\n" + table(["target", "must be", "medians", "per repeat", "met"], targets))
    if "no-plot" not in options:
        parts.append("![images/s against the link setting](benchmarks/results/link_speed.png)")
    return "\n\n".join(parts)


#: a result's "benchmark" -> its section: (result, options from the placeholder) -> markdown
SECTIONS: dict[str, Callable[..., str]] = {
    "allreduce": allreduce, "throughput": throughput, "loop_overhead": loop_overhead, "ddp_comm_hook": ddp_comm_hook,
    "probe_cost": probe_cost, "horovod_cycle": horovod_cycle, "stop_latency": stop_latency, "verdicts": verdicts,
    "exact_cost": exact_cost, "horovod_api": horovod_api, "horovod_suite": horovod_suite, "port_speed": port_speed,
    "negotiation": negotiation, "port_exit": port_exit, "engine_startup": engine_startup,
    "link_speed": link_speed}


def section(result: Result, *options: str) -> str:
    """A result's section and, one line each, its failed runs."""
    failed = ["- **FAILED** " + " ".join(str(f[k]) for k in ("backend", "label", "controller", "launcher", "model",
                                                            "mode", "case") if f.get(k))
              + f" x{f.get('world_size', '')}: {(f.get('error') or ' ').splitlines()[0]}"
              for f in result.get("failures", [])]
    return SECTIONS[result["benchmark"]](result, *options) + ("\n\n" + "\n".join(failed) if failed else "")


def command_block(command: str, width: int = 100) -> str:
    """A command in a bash block, wrapped between options (an option stays with its values)."""
    groups: list[str] = []
    for word in shlex.split(command):
        if groups and not word.startswith("-"):
            groups[-1] += " " + shlex.quote(word)
        else:
            groups.append(shlex.quote(word))
    lines = [groups[0]]
    for group in groups[1:]:
        if len(lines[-1]) + len(group) + 1 > width:
            lines[-1] += " \\"
            lines.append("    " + group)
        else:
            lines[-1] += " " + group
    return "```bash\n" + "\n".join(lines) + "\n```"


def framed(results: Results, file: str, *options: str) -> str:
    """A result file as BENCHMARKS.md shows it: its command, its section, where and when it was measured (the note
    that it is not measured yet, while the file is not there)."""
    result = results.get(file)
    if result is None:
        return results.missing(file)
    day = datetime.fromtimestamp(result["started"], tz=timezone.utc).strftime("%Y-%m-%d")
    revision = (result["machine"].get("versions") or {}).get("project_git")
    at = (revision[:12] + ("-dirty" if revision.endswith("-dirty") else "")) if revision else "no recorded revision"
    loaded = ", **under load**" if result.get("under_load") else ""
    return (f"{command_block(result['command'])}\n\n{section(result, *options)}\n\nSource: `{results.path(file)}` "
            f"(measured {day} at {at}, {conditions(result)}{loaded}).")


def counted(n: int, word: str, plural: str = "") -> str:
    """'1 false alarm', '2 false alarms': n and the word in the number it takes."""
    return f"{n} {word if n == 1 else plural or word + 's'}"


def verdicts_sentence(results: Results, file: str) -> str:
    """The verdict corpus in a few sentences, as docs/comparing.md quotes it (tests/test_docs.py checks)."""
    result = results.get(file)
    if result is None:
        return results.missing(file)
    at, key = {(g["floor_runs"], g["margin"]): g for g in result["grid"]}, f"{DEFAULT_FLOOR_RUNS}@{FLOOR_MARGIN:g}"

    def ratio(case: Result, where: str = key) -> float:
        return (case["judged"][where].get("largest_band_ratio") or {}).get("ratio") or 0.0

    same, real = ([c for c in result["cases"] if c["kind"] == kind] for kind in ("same", "real"))
    by_lr = [c for c in real if ratio(c) <= FLOOR_MARGIN and c["judged"][key]["correct"]]

    def alarms_of(cell: Result, where: str) -> tuple[list[Result], str]:
        """The same-training pairs called beyond, and how they read: ' (name, Nx what rounding gives; ...)' or ''."""
        alarms = [c for c in same if c["name"] in cell["false_alarms"]]
        read = "; ".join(f"{c['name']}, {ratio(c, where):,.0f}x what rounding gives" for c in alarms)
        return alarms, f" ({read})" if alarms else ""

    default = at[(DEFAULT_FLOOR_RUNS, FLOOR_MARGIN)]
    alarms, shown = alarms_of(default, key)
    text = (f"On {counted(len(same), 'same-training pair')} and {counted(len(real), 'pair')} with one real difference, "
            f"{DEFAULT_FLOOR_RUNS} disturbed runs at margin {FLOOR_MARGIN:g} give {counted(len(alarms), 'false alarm')}"
            f"{shown} and {counted(len(default['misses']), 'miss', 'misses')}: no {'other ' if alarms else ''}"
            f"same-training pair comes above {max(ratio(c) for c in same if c not in alarms):.2g}x what rounding "
            "gives, and every real difference is called beyond it from the step it first acts, leaving it by at least "
            f"{min(c['judged'][key].get('departure_ratio') or 0.0 for c in real if c not in by_lr):,.0f}x")
    if by_lr:
        text += " or differs in its learning rate (" + ", ".join(f"{c['name']}, {ratio(c):.2g}x" for c in by_lr) + ")"
    one = at.get((1, FLOOR_MARGIN))
    if one is not None and DEFAULT_FLOOR_RUNS != 1:
        _, shown = alarms_of(one, f"1@{FLOOR_MARGIN:g}")
        text += (f". One disturbed run gives {counted(len(one['false_alarms']), 'false alarm')}{shown} and "
                 f"{counted(len(one['misses']), 'miss', 'misses')}")
    return text + "."


def horovod_api_sentence(results: Results) -> str:
    """Horovod's suite counts per run and world size and the synthetic benchmark's ratios, as docs/horovod-api.md
    quotes them (tests/test_docs.py checks)."""
    suite, speed = results.get("horovod_suite.json"), results.get("horovod_api.json")
    parts = []
    if suite is not None:
        by_np: dict[int, list[str]] = {}
        for run in suite["runs"]:
            others = ", ".join(f"{run['counts'][end]} {end}" for end in ENDS[1:] if run["counts"].get(end))
            by_np.setdefault(run["np"], []).append(f"{name(run['label'])} {run['counts'].get('passed', 0)} passed"
                                                   + (f" ({others})" if others else ""))
        parts.append(f"Of the suite's {suite['tests']} tests, " + "; ".join(
            f"at {np} ranks: " + ", ".join(rows) for np, rows in sorted(by_np.items())))
    examples = (suite or {}).get("examples") or {}
    if examples.get("pytorch_mnist"):
        parts.append("Horovod's pytorch_mnist.py against Horovod/Gloo, final weights: " + ", ".join(
            f"{_mnist_case(key, ' with ')} {_weights_text(case.get('weights', {}), 'not compared', ' apart')}"
            for key, case in examples["pytorch_mnist"].items()))
        parts.append("At 2 ranks on the API: " + ", ".join(
            f"{script}.py {'ran' if examples[script].get('returncode') == 0 else 'FAILED'}" for script in API_EXAMPLES
            if script in examples))
    if speed is not None:
        b = speed["backends"]
        parts.append(f"{speed['model']} at {speed['image_size']}, {speed['np']} ranks: " + ", ".join(
            f"{name(label)} {b[label]['median']:.2f} img/s" for label in b) + "; the API's median is "
            + ", ".join(f"{ratio:.2f}x {name(label.split('/')[1])}'s" for label, ratio in speed["ratios"].items()))
    return ". ".join(parts) + "." if parts else results.missing()
