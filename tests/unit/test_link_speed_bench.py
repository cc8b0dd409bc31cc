"""benchmarks.link_speed without a launch: its cells, the medians of their repeats, the ratios the targets read,
the commands a script's backends start on the two hosts, and its section."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import link_speed
from common.compare import forecast
from benchmarks.sections import link_targets, section


def _plan(results: dict) -> link_speed.Plan:
    plan = link_speed.Plan({}, [], [], Path("."), 60.0)
    plan.results = results
    return plan


def _run(program: str, backend: str, link: str, img_s: float, comm: float | None = None) -> dict:
    return {"program": program, "backend": backend, "link": link, "img_s": img_s, "comm_frac": comm,
            "reduced_bytes_per_step": 4096 if program == "loop" else None, "step_ms": None, "summary": None}


def test_every_program_and_backend_at_every_link_link_by_link():
    cells = link_speed.cells_of(["synthetic", "loop"], ["api", "port"], ["ddp_train", "bare_ddp"],
                                ["unshaped", "1gbit"])
    assert [c.tag for c in cells[:4]] == ["synthetic-api-unshaped", "synthetic-port-unshaped",
                                          "loop-ddp_train-unshaped", "loop-bare_ddp-unshaped"]
    assert len(cells) == 8 and {c.link for c in cells[4:]} == {"1gbit"}
    assert all(c.program != "loop" for c in link_speed.cells_of(["synthetic"], ["api"], ["ddp_train"], ["1gbit"]))


def test_medians_and_the_ratios_at_each_link():
    plan = _plan({"synthetic-api-1gbit": [_run("synthetic", "api", "1gbit", v) for v in (9.0, 11.0, 10.0)],
                  "synthetic-port-1gbit": [_run("synthetic", "port", "1gbit", v) for v in (8.0, 12.0)],
                  "loop-ddp_train-1gbit": [_run("loop", "ddp_train", "1gbit", 19.0, 0.1),
                                           _run("loop", "ddp_train", "1gbit", 19.0, 0.3)],
                  "loop-bare_ddp-1gbit": [_run("loop", "bare_ddp", "1gbit", 20.0)]})
    table = link_speed.summarize(plan)
    assert table["synthetic-api-1gbit"]["median"] == 10.0 and table["synthetic-port-1gbit"]["median"] == 10.0
    assert table["loop-ddp_train-1gbit"]["comm_frac"] == 0.2 and table["loop-bare_ddp-1gbit"]["comm_frac"] is None
    found = link_speed.ratios(table, ["1gbit"])
    assert found["api/port synthetic @1gbit"] == 1.0 and found["ddp_train/bare_ddp @1gbit"] == 0.95
    assert found["hvd_train/horovod-gloo synthetic @1gbit"] is None


def test_a_script_runs_under_the_api_module_or_in_place_of_the_training_module_on_both_hosts():
    api = link_speed.script_commands("api", "/s/bench.py", ["--model", "resnet18"], 29600)
    assert set(api) == {"node0", "node1"}
    for cmd in api.values():
        assert cmd[cmd.index("-m") + 1] == "ddp_train.horovod_api" and "/s/bench.py" in cmd
    (gloo,) = link_speed.script_commands("horovod-gloo", "/s/bench.py", ["--model", "resnet18"], 29600).values()
    assert "node0:1,node1:1" in gloo and "/s/bench.py" in gloo and "-m" not in gloo[gloo.index("/s/bench.py"):]
    port = link_speed.script_commands("port", "/s/bench_ported.py", ["--model", "resnet18"], 29600)
    assert set(port) == {"node0", "node1"}
    for cmd in port.values():  # each host's own command, the script in place of `-m ddp_train`
        assert "/s/bench_ported.py" in cmd and "-m" not in cmd[cmd.index("/s/bench_ported.py"):]


def test_the_section_gives_each_backend_at_each_link_and_the_ratios():
    plan = _plan({"loop-ddp_train-unshaped": [_run("loop", "ddp_train", "unshaped", 30.0, 0.05)],
                  "loop-ddp_train-1gbit": [_run("loop", "ddp_train", "1gbit", 20.0, 0.25)],
                  "synthetic-api-1gbit": [_run("synthetic", "api", "1gbit", 12.5)]})
    table = link_speed.summarize(plan)
    links = {"unshaped": {"rate_bits": None, "shown": "unshaped"}, "1gbit": {"rate_bits": 1e9, "shown": "1 Gbit/s"}}
    result = {"benchmark": "link_speed", "batch_size": 16, "steps": 10, "repeats": 1, "links": links,
              "cells": table, "ratios": link_speed.ratios(table, list(links)), "failures": [],
              "forecasts": {"loop-ddp_train-1gbit": {"forecast_ms": 410.0, "measured_ms": 400.0, "error": 0.025}}}
    text = section(result)
    assert "| backend | unshaped | 1 Gbit/s |" in text
    assert "| ddp_train | 30.0 (5% exposed) | 20.0 (25% exposed) |" in text
    assert "| api | – | 12.5 |" in text and text.index("**synthetic**") < text.index("**loop**")
    assert "| loop: ddp_train | 1 Gbit/s | 410 | 400 | +2% |" in text


def test_each_loop_is_forecast_at_the_shaped_links_from_its_unshaped_run():
    summary = {"world_size": 2, "backend": "ddp", "reduced_bytes_per_step": 46_800_000,
               "time_split": {"data_ms": 0.0, "compute_ms": 300.0, "comm_ms": 10.0, "step_ms": 310.0}}
    plan = _plan({"loop-ddp_train-unshaped": [{**_run("loop", "ddp_train", "unshaped", 30.0, 0.03), "step_ms": 310.0,
                                               "summary": summary}],
                  "loop-ddp_train-1gbit": [{**_run("loop", "ddp_train", "1gbit", 20.0, 0.4), "step_ms": 500.0,
                                            "summary": summary}],
                  "loop-bare_ddp-1gbit": [_run("loop", "bare_ddp", "1gbit", 20.0)]})
    found = link_speed.forecasts(link_speed.summarize(plan), ["unshaped", "1gbit"])
    assert list(found) == ["loop-ddp_train-1gbit"]  # the unshaped run is the base; the bare loop has no split
    # the unshaped run's split, at 1 Gbit/s (common.compare.forecast's own arithmetic: tests/unit/test_forecast.py)
    expected = 1e3 * forecast.step_s(forecast.Measured.of(summary), forecast.Link(1e9))
    assert found["loop-ddp_train-1gbit"]["forecast_ms"] == pytest.approx(expected) and expected > 310.0
    assert found["loop-ddp_train-1gbit"]["error"] == pytest.approx(expected / 500.0 - 1)


def test_the_targets_are_judged_repeat_by_repeat_and_the_forecast_by_its_worst_cell():
    plan = _plan({"synthetic-api-1gbit": [_run("synthetic", "api", "1gbit", v) for v in (9.6, 9.0)],
                  "synthetic-port-1gbit": [_run("synthetic", "port", "1gbit", v) for v in (9.6, 10.0)],
                  "loop-ddp_train-1gbit": [_run("loop", "ddp_train", "1gbit", v) for v in (9.8, 9.9)],
                  "loop-bare_ddp-1gbit": [_run("loop", "bare_ddp", "1gbit", v) for v in (10.0, 10.0)],
                  "loop-hvd_train-1gbit": [_run("loop", "hvd_train", "1gbit", v) for v in (8.0, 8.5)],
                  "synthetic-horovod-gloo-1gbit": [_run("synthetic", "horovod-gloo", "1gbit", v) for v in (9.0, 9.0)]})
    links = {"1gbit": {"rate_bits": 1e9, "shown": "1 Gbit/s"}}
    result = {"cells": link_speed.summarize(plan), "links": links,
              "forecasts": {"a": {"error": -0.16}, "b": {"error": 0.05},
                            "synthetic-horovod-gloo-1gbit": {"error": 0.12}}}
    rows = {row[0]: row for row in link_targets(result)}
    # the API's repeats: 1.000 and 0.900, one on each side of 0.95
    assert rows["api/port synthetic, 1 Gbit/s"][3:] == ["1.000 0.900", "undecided"]
    assert rows["ddp_train/bare_ddp, 1 Gbit/s"][2:] == ["0.985", "0.980 0.990", "yes"]
    assert rows["hvd_train/horovod-gloo synthetic, 1 Gbit/s"][4] == "no"
    assert rows["forecast against the measured step, the loops, every link"][2:] == ["at most 16% off", "–", "no"]
    # a script's forecast is judged apart from the loops'
    assert rows["forecast against the measured step, the scripts, every link"][2:] == ["at most 12% off", "–", "yes"]
    assert "scripts" not in " ".join(row[0] for row in link_targets({**result, "forecasts": {"a": {"error": 0.0}}}))
    text = section({"benchmark": "link_speed", "batch_size": 8, "steps": 5, "repeats": 2, "ratios": {},
                    "failures": [], **result, "forecasts": {}}, "no-plot")
    assert "The targets:" in text and "link_speed.png" not in text
    assert link_targets({**result, "cells": {}, "forecasts": {}}) == []


def test_the_measured_step_and_the_forecast_are_medians_over_the_repeats():
    def split(compute_ms):
        return {"world_size": 2, "backend": "horovod", "reduced_bytes_per_step": 46_800_000,
                "time_split": {"data_ms": 0.0, "compute_ms": compute_ms, "comm_ms": 0.0, "step_ms": compute_ms}}

    base = [{**_run("loop", "hvd_train", "unshaped", 10.0), "step_ms": ms, "summary": split(ms)}
            for ms in (300.0, 900.0, 330.0)]
    shaped = [{**_run("loop", "hvd_train", "1gbit", v), "step_ms": ms, "summary": split(ms)}
              for v, ms in ((9.0, 500.0), (8.0, 600.0))]
    table = link_speed.summarize(_plan({"loop-hvd_train-unshaped": base, "loop-hvd_train-1gbit": shaped}))
    assert table["loop-hvd_train-1gbit"]["step_ms"] == 550.0  # two repeats: between them, not the slower one
    found = link_speed.forecasts(table, ["unshaped", "1gbit"])["loop-hvd_train-1gbit"]
    # each unshaped repeat forecast on its own (Horovod: compute + wire - 2/3 of the compute), then the median
    assert found["forecast_ms"] == pytest.approx(330.0 + 374.4 - 220.0)
    assert found["measured_ms"] == 550.0
