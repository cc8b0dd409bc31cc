"""The probe's time split of a script's step: data before its first forward, exposed communication as the hooks
report it, compute the rest (backward included); the run's split as the project's loop writes it."""

from __future__ import annotations

import json
import time

import torch

from common.probe.assemble import time_split
from common.probe.hooks import reduced_bytes
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


def test_the_bytes_reduced_are_the_dense_gradients_at_the_precision_they_travel_at():
    dense, sparse, frozen = torch.zeros(10, requires_grad=True), torch.zeros(4, requires_grad=True), torch.zeros(3)
    dense.grad = torch.ones(10)
    sparse.grad = torch.ones(4).to_sparse()
    params = [dense, sparse, frozen]
    assert reduced_bytes(params, "float32", "no compression seen") == 40
    assert reduced_bytes(params, "float16", "the optimizer's compression (FP16Compressor)") == 20
    assert reduced_bytes(params, "bfloat16", "DDP's comm hook (bf16_compress_hook)") == 20
    # values that happen to be float16 numbers still travel as float32
    assert reduced_bytes(params, "float16", "every reduced gradient is a float16 number") == 40
