"""The probe's time split of a script's step: data before its first forward, exposed communication as the hooks
report it, compute the rest (backward included); the run's split as the project's loop writes it."""

from __future__ import annotations

import json
import time

from common.probe.assemble import time_split
from common.probe.recorder import Recorder

BEFORE = {"groups": [], "state": {}, "gnorm": []}


def test_a_steps_backward_is_compute_and_its_wait_is_communication(tmp_path):
    recorder = Recorder(str(tmp_path), 0)
    time.sleep(0.02)  # the loader
    recorder.forward(None)
    time.sleep(0.03)  # forward and backward
    recorder.waited(0.01)  # of it, waiting on the link
    recorder.backward(1.0)
    time.sleep(0.02)  # the optimizer's own step
    recorder.waited(-1.0)  # a clock's jitter never takes time away
    recorder.step(BEFORE, [])
    recorder.close()
    step = json.loads((tmp_path / "probe" / "rank-0.jsonl").read_text().splitlines()[0])
    assert step["comm_s"] == 0.01
    assert 0.02 <= step["data_s"] < 0.04
    assert 0.04 <= step["compute_s"] < 0.07  # the 50 ms after the first forward, less the 10 ms waited


def test_the_runs_split_is_the_loops_and_its_fractions_add_up():
    steps = [{"data_s": 0.001, "compute_s": 0.006, "comm_s": 0.003}, {"data_s": 0.001, "compute_s": 0.004}]
    split = time_split(steps)
    assert split is not None
    assert split["steps"] == 2 and split["comm_ms"] == 1.5 and split["step_ms"] == 7.5
    assert abs(split["data_frac"] + split["compute_frac"] + split["comm_frac"] - 1) < 1e-12
    assert split["comm_frac"] == 0.2
    assert time_split([]) is None
