"""`compare-backends --scripts train_horovod.py --horovod-api`: one Horovod script, unchanged, under horovodrun (the
real Horovod, with both of its controllers by default) and under torchrun on the project's Horovod API, judged as any
pair at 3 ranks, where rounding alone can part two runs: within the noise floor of either controller
(test_horovod_api_parity shows the same bits at 2); the runs say which implementation ran, and the real Horovod never
ran under torchrun."""

from __future__ import annotations

import json

import pytest

from common.rundir.names import SUMMARY_FILE
from launched import compare_backends, read_run
from userscripts import write_folder

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def on_the_api(tmp_path_factory):
    here = write_folder(tmp_path_factory.mktemp("api"), {"train_horovod.py": ("train_horovod.py", ())})
    out = here / "compare"
    result = compare_backends("--scripts", "train_horovod.py", "--horovod-api", "--np", "3", "--repeats", "1",
                              "--floor-runs", "1", "--out", out, "--", "--epochs", "1", "--batch-size", "64", cwd=here)
    assert result.returncode == 0, result.output[-4000:]
    return result.output, json.loads((out / SUMMARY_FILE).read_text())


def test_the_api_trains_as_horovod_does(on_the_api):
    output, summary = on_the_api
    pairs = {(p["a"], p["b"]): p for p in summary["parity"] if p["kind"] == "backends"}
    assert {p["world_size"] for p in pairs.values()} == {3}
    for controller in ("gloo", "mpi"):
        pair = pairs[("horovod-api@3#1", f"horovod-{controller}@3#1")]
        assert pair["bitwise_identical"] or pair["within_noise_floor"] is True, pair["verdict"]
    columns = summary["summary"]["columns"]
    assert {"horovod-api vs horovod-gloo", "horovod-api vs horovod-mpi"} <= set(columns), columns


def test_each_run_says_which_implementation_ran(on_the_api):
    output, summary = on_the_api
    for run in summary["runs"]:
        config = read_run(run["path"])["config"]
        backend = config["backend"]
        if run["name"].startswith("horovod-api"):
            assert backend["name"] == "horovod-api" and backend["process_group"] == "gloo", backend
            assert "torchrun" in run["command"] and "--api horovod" in run["command"]
        else:
            assert backend["name"] == "horovod" and backend["controller"] in ("gloo", "mpi"), backend
            assert config["versions"]["horovod"] == "0.28.1"


def test_the_api_is_refused_without_one_horovod_script(tmp_path):
    (tmp_path / "train_ddp.py").write_text("import torch\n")
    for args, says in [(["--horovod-api", "--np", "2"], "give it with --scripts"),
                       (["--scripts", "train_ddp.py", "--horovod-api"], "give --scripts TRAIN_HOROVOD.py alone")]:
        result = compare_backends(*args, "--out", tmp_path / "out", cwd=tmp_path)
        assert result.returncode == 2 and says in result.output, result.output
