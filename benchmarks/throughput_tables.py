"""The throughput blocks of BENCHMARKS.md: every cell of a throughput result, the sweeps of one knob, the
data wait."""

from __future__ import annotations

from typing import Dict, List, Optional

from common.compare import stats, tables
from common.compare.benchmarks import loop_ratios

from .formatting import NAMES, failures, framed, rounded, setting, spread_cell
from .result_files import Results

#: the order of runs in a throughput table
RUN_ORDER = ["bare-ddp", "bare-ddp-batched", "ddp", "horovod-gloo", "horovod-mpi", "independent"]
#: swept knob -> (backend_options field with the value a run used, field saying who chose it or None, unit)
KNOB_RECORDS = {"HOROVOD_CYCLE_TIME": ("cycle_time_ms", "cycle_time_source", " ms"),
                "OMPI_MCA_mpi_yield_when_idle": ("mpi_yield_when_idle", "mpi_yield_source", ""),
                "deterministic": ("fusion_threshold_bytes", None, " B fusion threshold"),
                "HVD_TRAIN_WAIT": ("wait", "wait_source", "")}


def _ordered(keys) -> List[str]:
    def order(key: str):
        label, world = stats.split_key(key)
        return world, RUN_ORDER.index(label) if label in RUN_ORDER else len(RUN_ORDER), label
    return sorted(keys, key=order)


def _settings_line(result: Dict) -> str:
    st = result["settings"]
    extra = f", every run with `{' '.join(st['extra_train_args'])}`" if st.get("extra_train_args") else ""
    steps = st["steps"]  # one count, or one per model
    if isinstance(steps, dict):
        steps = (str(next(iter(steps.values()))) if len(set(steps.values())) == 1
                 else ", ".join(f"{n} ({model})" for model, n in steps.items()))
    return (f"{st['dataset'].capitalize()} data, per-rank batch {st['batch_size']}, {steps} steps per run "
            f"(the first not timed), median (min–max) of {st['repeats']} repeat(s){extra}.")


def throughput_table(results: Results, name: str) -> str:
    """Every cell of a throughput result: samples/s, scaling, exchange overhead, both loop ratios, time split."""

    def body() -> str:
        tp = results.get(name)
        rows = []
        for case in tp["cases"]:
            first = True
            seed, batched = loop_ratios(case)
            for key in _ordered(case["throughput"]):
                label, world = stats.split_key(key)
                n = str(world)
                split = case["time_split"].get(key) or {}
                is_ddp = label == "ddp"
                rows.append([f"{case['name']} {case['image_size']}x{case['image_size']}" if first else "",
                             NAMES.get(label, label), world, spread_cell(case["throughput"][key]),
                             tables.number(case["scaling_efficiency"].get(label, {}).get(n), ".2f"),
                             tables.percent(case["exchange_overhead"].get(label, {}).get(n)),
                             tables.number(seed.get(n) if is_ddp else None, ".2f"),
                             tables.number(batched.get(n) if is_ddp else None, ".2f"),
                             rounded(split.get("comm_ms"), 2) if split else tables.MISSING,
                             rounded(split.get("step_ms"), 3) if split else tables.MISSING,
                             tables.number(case["throughput"][key].get("job_cpu_s"), ".0f")])
                first = False
        table = tables.markdown(["model", "run", "world size", "samples/s", "scaling eff.", "exchange overhead",
                                 "loop / bare (seed)", "loop / bare (batched)", "comm ms/step", "step ms",
                                 "job CPU s"], rows)
        note = "" if any(loop_ratios(c)[1] for c in tp["cases"]) else (
            "\n\nThe batched bare loop is not in this result (it was measured before the benchmark ran it); "
            "the next run of `benchmarks/run_all.sh` adds it.")
        return _settings_line(tp) + "\n\n" + table + note + failures(tp)

    return framed(results, [name], body)


def _knob_of(result: Dict) -> Optional[str]:
    return next((c["knob"] for c in result["cases"] if c.get("knob")), None)


def _knob_used(case: Dict, knob: Optional[str]) -> str:
    """The value of `knob` the runs of `case` used, and who chose it, from their backend_options."""
    fields = KNOB_RECORDS.get(knob or "")
    if not fields:
        return tables.MISSING
    value_field, source_field, unit = fields
    options = next((r["backend_options"] for r in case["runs"]
                    if (r.get("backend_options") or {}).get(value_field) is not None), None)
    if options is None:
        return tables.MISSING
    value = options[value_field]
    shown = f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"
    return f"{shown} ({options[source_field]})" if source_field and options.get(source_field) else shown


COLUMNS = ("samples", "scaling", "comm", "cpu")


def sweep_table(results: Results, name: str, columns: str = "samples,scaling,comm,cpu") -> str:
    """One row per case (model x setting) of a throughput sweep: the knob's value the runs used, then per
    backend the chosen columns: samples/s at each world size, scaling efficiency, exposed comm ms/step
    and job CPU s at the largest world size."""
    chosen = columns.split(",")
    unknown = [c for c in chosen if c not in COLUMNS]
    if unknown:
        raise ValueError(f"sweep_table: unknown column {', '.join(unknown)}; choose from {', '.join(COLUMNS)}")

    def body() -> str:
        result = results.get(name)
        knob = _knob_of(result)
        worlds = sorted(result["settings"]["world_sizes"])
        top = worlds[-1]
        many_models = len({c["model"] for c in result["cases"]}) > 1
        headers = (["model"] if many_models else []) + ["setting", f"{knob or 'knob'} used"]
        for label in result["settings"]["backends"]:
            shown = NAMES.get(label, label)
            if "samples" in chosen:
                headers += [f"{shown} x{n} samples/s" for n in worlds]
            if "scaling" in chosen and 1 in worlds and top > 1:
                headers.append(f"{shown} scaling x{top}")
            if "comm" in chosen:
                headers.append(f"{shown} comm ms/step x{top}")
            if "cpu" in chosen:
                headers.append(f"{shown} job CPU s x{top}")
        rows = []
        for case in result["cases"]:
            row = ([case["model"]] if many_models else []) + [setting(case), _knob_used(case, knob)]
            for label in result["settings"]["backends"]:
                if "samples" in chosen:
                    row += [spread_cell(case["throughput"].get(f"{label}@{n}")) for n in worlds]
                if "scaling" in chosen and 1 in worlds and top > 1:
                    row.append(tables.number(case["scaling_efficiency"].get(label, {}).get(str(top)), ".2f"))
                if "comm" in chosen:
                    row.append(rounded((case["time_split"].get(f"{label}@{top}") or {}).get("comm_ms"), 2))
                if "cpu" in chosen:
                    row.append(tables.number((case["throughput"].get(f"{label}@{top}") or {}).get("job_cpu_s"), ".0f"))
            rows.append(row)
        return _settings_line(result) + "\n\n" + tables.markdown(headers, rows) + failures(result)

    return framed(results, [name], body)


def data_wait_table(results: Results, *names: str) -> str:
    """Step time and the share of it spent waiting for data, per dataset, run and world size."""

    def body() -> str:
        rows = []
        for name in names:
            result = results.get(name)
            for case in result["cases"]:
                first = True
                for key in _ordered(case["time_split"]):
                    label, world = stats.split_key(key)
                    split = case["time_split"][key]
                    data = f"{result['settings']['dataset']} {case['image_size']}x{case['image_size']}"
                    rows.append([data if first else "", NAMES.get(label, label), world,
                                 rounded(split.get("step_ms"), 2), tables.percent(split.get("data_frac"))])
                    first = False
        settings = " ".join(_settings_line(results.get(n)) for n in names)
        return settings + "\n\n" + tables.markdown(["data", "run", "world size", "step ms", "data %"], rows)

    return framed(results, list(names), body)
