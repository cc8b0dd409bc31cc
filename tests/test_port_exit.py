"""A ported script ends as it means to, every time: benchmarks/port_exit.py's count, small. The port of a Horovod
script whose model is a global (code at module level) and of one whose main() fails after training, each run 5 times
at 3 ranks under torchrun: every run of the first exits 0, every run of the second exits 1 with its own traceback, and
no rank aborts at Python's teardown (ddp_train/port/ending.py; `python -m benchmarks.port_exit --runs 50` is the full
count, in BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest

from benchmarks.port_exit import main as port_exit

pytestmark = pytest.mark.timeout(900)


def test_every_run_of_a_port_at_3_ranks_exits_as_the_script_means_without_an_abort(tmp_path):
    assert port_exit(["--runs", "5", "--np", "3", "--variants", "module,fails", "--out", str(tmp_path)]) == 0
    rows = {row["variant"]: row for row in json.loads((tmp_path / "port_exit.json").read_text())["rows"]}
    assert rows["module"]["exits"] == {"0": 5} and rows["fails"]["exits"] == {"1": 5}
    assert [(row["aborts"], row["as_expected"]) for row in rows.values()] == [(0, 5), (0, 5)]
