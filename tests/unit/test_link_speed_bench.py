"""benchmarks.link_speed without a launch: its cells, the medians of their repeats, the ratios the targets read,
the commands a script's backends start on the two hosts, and its section."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import link_speed
from benchmarks.sections import section


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
    assert "| ddp_train | 1 Gbit/s | 410 | 400 | +2% |" in text


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
    assert found["loop-ddp_train-1gbit"]["forecast_ms"] == pytest.approx(300.0 + 374.4 - 200.0)
    assert found["loop-ddp_train-1gbit"]["error"] == pytest.approx(474.4 / 500.0 - 1)
