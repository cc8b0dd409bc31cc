"""Start-up without the garbage collector's scans (common.launch.startup): a rank imports torch without a full
collection, then builds the user's model and trains with the collector on and what its imports made frozen out of
it; a user's script under the probe starts the same way, with the collector as python gives it. A rank builds the
user's model with the thread count it trains with, under a launcher that exports none."""

from __future__ import annotations

import json
import textwrap

from launched import PY, command, job_env, read_run, run_cmd

#: a model whose factory records the collector's state, and so does its every forward pass: the last one is in
#: training, after start-up
RECORDING_MODEL = '''
    import gc
    import json
    import os

    from torch import nn


    class Recording(nn.Linear):
        def forward(self, x):
            with open(os.environ["GC_STATE"], "w") as f:
                json.dump({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}, f)
            return super().forward(x.flatten(1))


    def build(num_classes, channels, image_size, **_):
        with open(os.environ["GC_STATE"] + ".build", "w") as f:
            json.dump({"enabled": gc.isenabled(), "full_collections": gc.get_stats()[2]["collections"]}, f)
        return Recording(channels * image_size * image_size, num_classes)
'''
#: a user's script that records the collector's state as its first act, then trains two steps
RECORDING_SCRIPT = '''
    import gc
    import json
    import sys

    import torch

    state = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
             "full_collections": gc.get_stats()[2]["collections"]}
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
    with open(sys.argv[1], "w") as f:
        json.dump(state, f)
'''
#: a model whose factory records, per rank, the intra-op threads torch has while it builds the model
THREADS_MODEL = '''
    import json
    import os

    import torch
    from torch import nn


    def build(num_classes, channels, image_size, **_):
        with open(os.environ["THREADS_STATE"] + "." + os.environ["HOROVOD_RANK"], "w") as f:
            json.dump({"threads": torch.get_num_threads()}, f)
        return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, num_classes))
'''
#: fewer objects than importing torch alone makes (about half a million)
STARTUP_OBJECTS = 100_000
#: full collections before the user's code runs: none with the collector paused, 5 when it scans the imports
FULL_COLLECTIONS = 1


def train_users_model(tmp_path, launcher: str, np: int, name: str, source: str, steps: int, env) -> None:
    """Write the user's model module `name` into `tmp_path` and train it there for `steps` steps (run dir: run)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    run_cmd(command(launcher, np, ["--model", f"{name}:build", "--max-steps", str(steps), "--run-dir",
                                   str(tmp_path / "run")]),
            env=job_env(env), cwd=tmp_path, timeout=180).check()


def test_a_rank_builds_the_model_and_trains_with_the_collector_on_and_its_imports_frozen(tmp_path):
    state = tmp_path / "gc.json"
    train_users_model(tmp_path, "none-ddp", 1, "recording", RECORDING_MODEL, 2, {"GC_STATE": str(state)})
    built = json.loads((tmp_path / "gc.json.build").read_text())
    assert built["enabled"] is True, "the user's model was built with the collector paused: its cycles would be " \
        "frozen for good"
    assert built["full_collections"] <= FULL_COLLECTIONS, built
    recorded = json.loads(state.read_text())
    assert recorded["enabled"] is True, "the collector stays paused in training"
    assert recorded["frozen"] > STARTUP_OBJECTS, recorded


def test_a_probed_script_starts_with_the_collector_on(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(RECORDING_SCRIPT))
    state = tmp_path / "gc.json"
    run_cmd([PY, "-m", "common.probe", "--run-dir", str(tmp_path / "run"), "train.py", str(state)],
            cwd=tmp_path, timeout=120).check()
    recorded = json.loads(state.read_text())
    assert recorded["enabled"] is True, recorded
    assert recorded["frozen"] > STARTUP_OBJECTS and recorded["full_collections"] <= FULL_COLLECTIONS, recorded
    assert read_run(tmp_path / "run")["summary"]["steps"] == 2


def test_a_rank_builds_the_model_with_the_threads_it_trains_with_under_horovodrun(tmp_path):
    """horovodrun exports no OMP_NUM_THREADS: torch alone would build the model on every core in every rank."""
    state = tmp_path / "threads"
    train_users_model(tmp_path, "horovodrun-gloo", 2, "threads_model", THREADS_MODEL, 1, {"THREADS_STATE": str(state)})
    trained = read_run(tmp_path / "run")["config"]["threads"]
    built = [json.loads((tmp_path / f"threads.{rank}").read_text())["threads"] for rank in range(2)]
    assert built == [trained, trained], f"built with {built} threads, trained with {trained}"
