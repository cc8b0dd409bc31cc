"""scripts/gpu_check.sh, the GPU check, rehearsed on CPU (GPU_CHECK_DEVICE=cpu): every step runs with Gloo through
the code paths the GPU run takes above the device, and its JSON records each step's outcome, time and findings,
the versions, and the error line of a step that failed, which makes the exit code non-zero.

The check runs with a python of its own, as on a GPU machine: one that has this environment's packages (torch,
torchvision, Horovod) but not the project, which the check's first step installs into it.
"""

import functools
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = ["install", "ddp", "amp_fp16", "amp_bf16", "channels_last", "exact", "horovod_api", "horovod_build",
         "compare"]
#: the whole rehearsal on a loaded 2-core machine (it takes about 2 minutes on an idle one)
BUDGET_S = 900

pytestmark = pytest.mark.timeout(BUDGET_S + 300)


def machine_python(root: Path) -> Path:
    """An interpreter like a GPU machine's python3: this environment's packages on its path, its own site-packages
    (where the check installs the project), torchrun and horovodrun beside it."""
    env = root / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = Path(sysconfig.get_paths(vars={"base": str(env), "platbase": str(env)})["purelib"])
    (site / "packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for name in ("torchrun", "horovodrun"):
        source = Path(sys.executable).parent / name
        if source.exists():
            body = source.read_text().split("\n", 1)[1]
            target = env / "bin" / name
            target.write_text(f"#!{env / 'bin' / 'python'}\n{body}")
            target.chmod(0o755)
    return env / "bin" / "python"


def gpu_check(root: Path, python: Path, **variables: str) -> tuple:
    """Run the check on CPU with `python`; (completed process, its JSON)."""
    out = root / "out"
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_PYTHON": str(python), "GPU_CHECK_OUT": str(out),
           "GPU_CHECK_WORK": str(root / "work"), "GPU_CHECK_BUDGET": str(BUDGET_S),
           "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}", **variables}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=BUDGET_S + 200)
    record = json.loads((out / "gpu_check.json").read_text())
    return done, record


@functools.cache
def horovod_here() -> bool:
    return subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-check")
    done, record = gpu_check(root, machine_python(root))
    return root, done, record


def steps_of(record: dict) -> dict:
    return {step["name"]: step for step in record["steps"]}


def test_every_step_recorded_with_time_and_outcome(rehearsal):
    root, done, record = rehearsal
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert record["ok"] is True and record["failed"] == [] and record["device"] == "cpu" and record["rehearsal"]
    assert [step["name"] for step in record["steps"]] == STEPS
    steps = steps_of(record)
    for step in record["steps"]:
        assert step["outcome"] in ("ok", "skipped"), step
        assert isinstance(step["seconds"], float) and step["started_s"] is not None, step
        assert step["error"] is None, step
    ran = ["install", "ddp", "amp_bf16", "channels_last", "exact", "horovod_api", "compare"]
    assert all(steps[name]["outcome"] == "ok" and steps[name]["limit_s"] > 0 for name in ran)
    assert steps["amp_fp16"]["outcome"] == "skipped" and "CUDA only" in steps["amp_fp16"]["reason"]
    build = steps["horovod_build"]
    assert build["outcome"] == "skipped" and build["required"] is False
    assert ("installed already" in build["reason"]) if horovod_here() else ("does not build" in build["reason"])
    # Every step within its box, the whole within the budget, and what the check printed says the same.
    assert all(step["seconds"] <= step["limit_s"] + 15 for step in record["steps"] if step["outcome"] == "ok")
    assert record["wall_s"] <= BUDGET_S
    assert f"[gpu_check] ok in {record['wall_s']:.0f} s" in done.stdout
    for name in STEPS:
        assert f"[gpu_check] {name}: {steps[name]['outcome']}" in done.stdout
    with tarfile.open(root / "out" / "gpu_check_logs.tar.gz") as logs:
        assert {f"logs/{name}.log" for name in ran} <= set(logs.getnames())


def test_versions_and_install(rehearsal):
    root, _, record = rehearsal
    versions = record["versions"]
    assert versions["torch"] == torch.__version__
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert versions["torchvision"] and versions["cuda_available"] is False and "cuda" in versions
    install = steps_of(record)["install"]["result"]
    assert install["method"] == record["install"] == "pip install --no-deps --no-build-isolation -e ."
    assert install["project"]["path"] == str(REPO)
    assert install["entry_points"]["loopback"] is True
    assert set(install["entry_points"]["launchers"]) == {"ddp_train", "hvd_train"}
    # This torch has DDP's forward_sync_buffers; the project uses it.
    assert record["compat"]["ddp_buffers_keyword"] == "forward_sync_buffers" and record["compat"]["notes"] == []


def test_runs_on_gloo_one_rank_per_process(rehearsal):
    root, _, record = rehearsal
    steps = steps_of(record)
    for name in ("ddp", "amp_bf16", "channels_last"):
        result = steps[name]["result"]
        assert result["process_group"] == "gloo" and result["devices"] == ["cpu", "cpu"], result
        assert result["world_size"] == 2 and result["steps"] == 4 and result["samples_per_s"] > 0
        assert result["buffers_keyword"] == "forward_sync_buffers"
        assert (root / "work" / result["run_dir"] / "model.pt").exists()
    assert steps["amp_bf16"]["result"]["precision"]["amp"] == "bf16"
    assert steps["channels_last"]["result"]["channels_last"] is True


def test_exact_runs_bitwise_identical(rehearsal):
    root, _, record = rehearsal
    exact = steps_of(record)["exact"]["result"]
    assert exact["repeat_identical"] is True and exact["world_sizes_identical"] is True
    assert {run["world_size"] for run in exact["runs"].values()} == {1, 2}
    weights = {name: torch.load(root / "work" / run["run_dir"] / "model.pt", weights_only=True)
               for name, run in exact["runs"].items()}
    for name in ("b", "one"):
        assert weights[name].keys() == weights["a"].keys()
        assert all(torch.equal(weights[name][k], weights["a"][k]) for k in weights["a"]), name


def test_horovod_api_and_compare(rehearsal):
    _, _, record = rehearsal
    steps = steps_of(record)
    api = steps["horovod_api"]["result"]
    assert api["size"] == 2 and api["allreduce_sum"] == 1.0 and api["weights_equal"] is True
    assert [w["device"] for w in api["workers"]] == ["cpu", "cpu"] and api["img_sec_total"] > 0
    compare = steps["compare"]["result"]
    backends = {run["backend"] for run in compare["runs"]}
    assert backends == ({"ddp", "horovod-gloo"} if horovod_here() else {"ddp"}), compare
    assert all(run["world_size"] == 2 and run["samples_per_s"] > 0 for run in compare["runs"])
    if horovod_here():
        assert any("ddp vs horovod-gloo" in key for key in compare["verdicts"]), compare["verdicts"]


def test_failed_step_recorded_with_error_line_and_exit_code(tmp_path):
    """pip made to fail takes the PYTHONPATH fallback (the project's metadata written beside the tree); a training
    step made to fail is recorded with the program's error line, and the check exits 1."""
    done, record = gpu_check(tmp_path, machine_python(tmp_path), GPU_CHECK_STEPS="install,ddp",
                             GPU_CHECK_FAIL="install,ddp")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert record["ok"] is False and record["failed"] == ["ddp"] and record["forced_failures"] == ["install", "ddp"]
    steps = steps_of(record)
    install = steps["install"]
    assert install["outcome"] == "ok" and install["result"]["method"].startswith("PYTHONPATH")
    assert "--gpu-check-forced-failure" in install["result"]["pip_error"]
    info = tmp_path / "work" / "site" / "hvd_ddp_compare-0.1.0.dist-info"
    assert "loopback = ddp_train.rendezvous:torchrun_handler" in (info / "entry_points.txt").read_text()
    assert install["result"]["entry_points"]["loopback"] is True
    ddp = steps["ddp"]
    assert ddp["outcome"] == "failed"
    assert ddp["error"].startswith("exit code ") and "ddp_train: error:" in ddp["error"]
    assert "--gpu-check-forced-failure" in ddp["error"] and ddp["result"]["log_tail"]
    assert "[gpu_check] ddp: failed" in done.stdout and "FAILED: ddp" in done.stdout
    for name in STEPS[2:]:
        assert steps[name]["outcome"] == "skipped" and steps[name]["reason"] == "not in GPU_CHECK_STEPS", name
