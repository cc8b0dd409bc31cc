"""Tuning knobs and profiling: the same flag on both backends, recorded in config.json, and
bitwise parity at world size 2 for every knob that does not change the numbers."""

from __future__ import annotations

import json
import re

import pytest
import torch

from launch import PY, command, launch, max_abs_diff, read_run, run_cmd, step_losses

# World size 2, batch 32: 23 batches per rank and epoch; 16 steps cross an epoch boundary even at
# --accumulate 2 (11 steps per epoch).
COMMON = ["--dataset", "digits", "--batch-size", "32", "--epochs", "2", "--max-steps", "16", "--threads", "1",
          "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]
MLP = ["--model", "mlp"]
CONVNET = ["--model", "convnet"]
# Knobs that leave the arithmetic of a rank unchanged, or change it the same way on both backends.
PARITY = {
    "baseline": MLP,
    "bucket": MLP + ["--bucket-mb", "0.001"],  # about 1 KB: many buckets / fusion groups
    "accumulate": MLP + ["--accumulate", "2"],
    "clip": MLP + ["--clip-grad-norm", "0.05"],
    "convnet": CONVNET,
    "channels-last": CONVNET + ["--channels-last"],
    "bf16": CONVNET + ["--amp", "bf16"],
}
OTHER = {
    "fp16-compression": MLP + ["--compression", "fp16"],
}
BACKENDS = {"torchrun": "ddp", "horovodrun-gloo": "horovod"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs(launcher, setting) -> parsed run dir, each launched once and shared by the tests."""
    cache = {}

    def get(launcher: str, setting: str):
        if (launcher, setting) not in cache:
            run_dir = tmp_path_factory.mktemp(f"{launcher}-{setting}")
            args = {**PARITY, **OTHER}[setting]
            launch(launcher, 2, COMMON + args + ["--run-dir", str(run_dir)]).check()
            cache[launcher, setting] = read_run(run_dir)
        return cache[launcher, setting]

    return get


@pytest.mark.parametrize("setting", [s for s in PARITY if s not in ("baseline", "convnet")])
def test_knob_keeps_world_size_2_parity(runs, setting):
    ddp, hvd = runs("torchrun", setting), runs("horovodrun-gloo", setting)
    assert step_losses(hvd) == step_losses(ddp)
    assert hvd["summary"]["weights_sha256"] == ddp["summary"]["weights_sha256"]
    assert len(step_losses(ddp)) == 16
    expected = {"accumulate": ("accumulate", 2), "channels-last": ("channels_last", True),
                "clip": ("clip_grad_norm", 0.05), "bf16": ("amp", "bf16"), "bucket": ("bucket_mb", 0.001)}
    key, value = expected[setting]
    assert ddp["config"]["config"][key] == hvd["config"]["config"][key] == value


@pytest.mark.parametrize("setting,reference", [("accumulate", "baseline"), ("clip", "baseline"),
                                               ("bf16", "convnet")])
def test_knob_changes_the_numbers(runs, setting, reference):
    """The knob really acted: the weights differ from the same run without it."""
    assert runs("torchrun", setting)["summary"]["weights_sha256"] != \
        runs("torchrun", reference)["summary"]["weights_sha256"]


def test_bucket_size_reaches_both_backends(runs):
    ddp, hvd = runs("torchrun", "bucket")["config"], runs("horovodrun-gloo", "bucket")["config"]
    assert ddp["config"]["bucket_mb"] == hvd["config"]["bucket_mb"] == 0.001
    assert ddp["backend"]["bucket_cap_mb"] == 0.001
    assert hvd["backend"]["fusion_threshold_bytes"] == int(0.001 * 1024 * 1024)
    # The default matches DDP's own: 25 MB on both.
    base = runs("horovodrun-gloo", "baseline")["config"]
    assert base["backend"]["fusion_threshold_bytes"] == 25 * 1024 * 1024


def test_accumulation_counts_optimizer_steps(runs):
    config = runs("torchrun", "accumulate")["config"]
    # 23 micro-batches per rank and epoch: 11 steps, the 23rd micro-batch dropped.
    assert config["steps_per_epoch"] == 11
    assert config["global_batch"] == 32 * 2 * 2 and config["micro_batches_per_step"] == 2
    assert runs("horovodrun-gloo", "accumulate")["config"]["backend"]["backward_passes_per_step"] == 2
    assert runs("torchrun", "accumulate")["config"]["backend"]["accumulate"] == 2
    steps = [e for e in runs("torchrun", "accumulate")["events"] if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 17))
    assert all(e["batch"] == 64 for e in steps)  # samples of rank 0 in one step


def test_accumulation_equals_the_larger_batch(tmp_path):
    """K micro-batches of B samples average the gradient of one batch of K x B (the same samples in
    the same order), up to float rounding: the loss is divided by K on both backends."""
    args = ["--model", "mlp", "--dataset", "digits", "--max-steps", "8", "--threads", "1", "--lr", "0.1"]
    launch("horovodrun-gloo", 2, args + ["--batch-size", "64", "--run-dir", str(tmp_path / "big")]).check()
    launch("horovodrun-gloo", 2, args + ["--batch-size", "32", "--accumulate", "2",
                                         "--run-dir", str(tmp_path / "acc")]).check()
    big, acc = read_run(tmp_path / "big"), read_run(tmp_path / "acc")
    assert max_abs_diff(big["model"], acc["model"]) < 1e-5
    assert step_losses(big) == pytest.approx(step_losses(acc), abs=1e-5)


@pytest.mark.parametrize("launcher", list(BACKENDS))
def test_fp16_compression_runs_and_is_recorded(runs, launcher):
    run, plain = runs(launcher, "fp16-compression"), runs(launcher, "baseline")
    assert run["config"]["config"]["compression"] == "fp16"
    backend = run["config"]["backend"]
    assert backend["compression"] == "fp16"
    if BACKENDS[launcher] == "ddp":
        assert backend["comm_hook"] == "fp16_compress_hook"
    # Float16 gradients: close to the float32 run, and not equal to it (the compression acted).
    diff = max_abs_diff(run["model"], plain["model"])
    assert 0 < diff < 1e-2
    assert all(map(lambda loss: loss == loss, step_losses(run)))


def test_fp16_compression_across_backends(runs):
    """Not bitwise: DDP halves in float16 before the sum, Horovod after it. Close all the same."""
    ddp, hvd = runs("torchrun", "fp16-compression"), runs("horovodrun-gloo", "fp16-compression")
    assert max_abs_diff(ddp["model"], hvd["model"]) < 1e-3


@pytest.mark.parametrize("launcher", list(BACKENDS))
def test_bf16_amp_is_recorded(runs, launcher):
    config = runs(launcher, "bf16")["config"]
    assert config["config"]["amp"] == "bf16"
    assert config["precision"] == {"amp": "bf16", "autocast_dtype": "bfloat16", "grad_scaler": False}


FP16_CPU_ERROR = "--amp fp16 needs a CUDA device"


@pytest.mark.parametrize("device", ["cpu", "auto"])
@pytest.mark.parametrize("launcher,np", [("none-ddp", 1), ("torchrun", 2), ("horovodrun-gloo", 2)])
def test_fp16_amp_on_cpu_is_refused_on_every_rank(tmp_path, launcher, np, device):
    if device == "auto" and torch.cuda.is_available():
        pytest.skip("--device auto picks the GPU here, where --amp fp16 is allowed")
    result = launch(launcher, np, ["--amp", "fp16", "--device", device, "--run-dir", str(tmp_path / "run")],
                    timeout=60)
    assert result.returncode != 0
    assert result.seconds < 45, f"took {result.seconds:.1f}s"  # imports only; generous for a loaded machine
    errors = [line for line in result.output.splitlines() if ": error: " in line and "_train" in line]
    for rank in range(np):
        mine = [line for line in errors if re.search(rf"\[rank {rank}\]", line) or np == 1]
        assert mine and FP16_CPU_ERROR in mine[0] and "--amp bf16" in mine[0], result.output[-3000:]
    assert not re.search(r'File ".*/(common|ddp_train|hvd_train)/', result.output), result.output[-3000:]
    assert not (tmp_path / "run" / "summary.json").exists()


def resume_args(accumulate: int, *extra: str):
    return MLP + ["--dataset", "digits", "--batch-size", "32", "--epochs", "2", "--threads", "1", "--optimizer",
                  "adam", "--lr", "0.002", "--weight-decay", "0.01", "--accumulate", str(accumulate), *extra]


def test_exact_resume_with_accumulation_mid_epoch(tmp_path):
    # 11 steps per epoch: 8 stops mid-way through the first epoch, 16 is mid-way through the second.
    split = str(tmp_path / "split")
    launch("torchrun", 2, resume_args(2, "--max-steps", "16", "--run-dir", str(tmp_path / "full"))).check()
    launch("horovodrun-gloo", 2, resume_args(2, "--max-steps", "8", "--checkpoint-every", "3",
                                             "--run-dir", split)).check()
    ckpt = torch.load(tmp_path / "split" / "checkpoints" / "ckpt-000000008.pt", weights_only=True)
    assert (ckpt["step"], ckpt["batch"], ckpt["epoch"]) == (8, 16, 0)  # batch counts micro-batches
    result = launch("torchrun", 2, resume_args(2, "--max-steps", "16", "--resume", "auto",
                                               "--run-dir", split)).check()
    assert "resuming from" in result.output and "step 8" in result.output
    full, resumed = read_run(tmp_path / "full"), read_run(tmp_path / "split")
    assert resumed["summary"]["weights_sha256"] == full["summary"]["weights_sha256"]
    assert step_losses(resumed) == step_losses(full)
    # The resumed epoch's metrics cover all its steps, as in one go.
    last_epoch = lambda run: [e for e in run["events"] if e["event"] == "epoch"][-1]  # noqa: E731
    assert last_epoch(resumed)["train_loss"] == last_epoch(full)["train_loss"]

    # Another --accumulate would count the epoch's position and the schedule differently: refused.
    refused = launch("torchrun", 2, resume_args(3, "--max-steps", "16", "--resume", "auto", "--run-dir", split),
                     timeout=60)
    assert refused.returncode != 0
    assert "accumulate 2 in the checkpoint, 3 now" in refused.output


def _horovod_timeline(path):
    """Horovod writes its timeline as a JSON array that is closed only at shutdown, if at all."""
    text = path.read_text().strip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return json.loads(text)


@pytest.mark.parametrize("launcher", list(BACKENDS))
def test_profile_writes_a_trace(tmp_path, launcher):
    result = launch(launcher, 2, MLP + ["--dataset", "digits", "--max-steps", "8", "--threads", "1",
                                        "--profile", "3", "--run-dir", str(tmp_path)]).check()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["config"]["profile"] == 3 and config["profile"]["steps"] == 3
    if BACKENDS[launcher] == "ddp":
        trace = tmp_path / "profile" / "ddp-rank0.pt.trace.json"
        assert config["profile"]["file"].endswith("profile/ddp-rank0.pt.trace.json")
        assert trace.stat().st_size > 0
        events = json.loads(trace.read_text())["traceEvents"]
        names = {e.get("name", "") for e in events}
        # One ProfilerStep span per traced optimizer step, and the gradient allreduce inside them.
        assert sum(name.startswith("ProfilerStep#") for name in names) == 3, sorted(names)[:50]
        assert any("allreduce" in name.lower() for name in names)
        assert not (tmp_path / "profile" / "ddp-rank1.pt.trace.json").exists()
    else:
        timeline = tmp_path / "profile" / "horovod-timeline.json"
        assert timeline.stat().st_size > 0, result.output[-2000:]
        events = _horovod_timeline(timeline)
        assert isinstance(events, list) and events
        assert any("ALLREDUCE" in json.dumps(e) for e in events)


def test_help_lists_the_knobs_on_both_entry_points():
    for module in ("ddp_train", "hvd_train"):
        text = run_cmd([PY, "-m", module, "--help"], timeout=60).check().output
        for option in ("--compression", "--bucket-mb", "--accumulate", "--amp", "--clip-grad-norm",
                       "--channels-last", "--profile"):
            assert option in text, (module, option)
        assert re.search(r"64\s+MB", text)  # Horovod's own fusion default, next to ours


def test_grad_scaler_state_survives_a_checkpoint(tmp_path):
    """The GradScaler's state (--amp fp16, CUDA only for training) goes through the checkpoint format:
    saved with the checkpoint, loaded with weights_only=True, restored into a fresh scaler. Run on
    CPU in-process, since only the state's round trip is under test."""
    from common.backend import LocalBackend
    from common.checkpoint import atomic_save, verified_load
    from common.precision import Precision

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = Precision("fp16", torch.device("cpu"))
    loss = model(torch.ones(3, 4)).sum()
    before.scale(loss).backward()
    before.unscale(optimizer)
    LocalBackend().step(optimizer, before.scaler)  # steps and updates the scale
    saved = before.state_dict()
    assert saved["scale"] == 65536.0 and saved["_growth_tracker"] == 1  # one finite step counted

    path = str(tmp_path / "ckpt.pt")
    atomic_save({"format": 1, "scaler": saved}, path)
    after = Precision("fp16", torch.device("cpu"))
    after.load_state_dict(verified_load(path)["scaler"])
    assert after.state_dict() == saved
    assert Precision("bf16", torch.device("cpu")).state_dict() is None  # no scaler: nothing saved


def test_horovod_cycle_time_follows_the_model_size_unless_the_user_sets_it(runs, tmp_path):
    """On CPU, a model with at least 16 MB of gradients gets a 5 ms Horovod cycle (its background
    thread then takes less of the cores the ranks compute on), a small one Horovod's own 1 ms, and
    `horovodrun --cycle-time-ms` (HOROVOD_CYCLE_TIME) always wins."""
    small = runs("horovodrun-gloo", "baseline")["config"]["backend"]
    assert (small["cycle_time_ms"], small["cycle_time_source"]) == (1.0, "Horovod's default")
    resnet = ["--model", "resnet18", "--dataset", "synthetic", "--image-size", "32", "--synthetic-samples", "64",
              "--batch-size", "4", "--epochs", "1", "--max-steps", "1", "--threads", "1"]
    chosen = tmp_path / "chosen"
    result = launch("horovodrun-gloo", 2, resnet + ["--run-dir", str(chosen)]).check()
    assert result.output.count("hvd_train: HOROVOD_CYCLE_TIME=5 (the model has 43 MB of gradients") == 1
    backend = json.loads((chosen / "config.json").read_text())["backend"]
    assert (backend["cycle_time_ms"], backend["cycle_time_source"]) == (5.0, "hvd_train: 43 MB of gradients on CPU")
    given = tmp_path / "given"
    cmd = command("horovodrun-gloo", 2, resnet + ["--run-dir", str(given)])
    run_cmd(cmd[:1] + ["--cycle-time-ms", "2"] + cmd[1:]).check()
    backend = json.loads((given / "config.json").read_text())["backend"]
    assert (backend["cycle_time_ms"], backend["cycle_time_source"]) == (2.0, "environment")


def test_open_mpi_yields_when_idle_on_cpu_unless_the_user_sets_it(runs, tmp_path):
    """Under the MPI controller on CPU, hvd_train sets OMPI_MCA_mpi_yield_when_idle=1 (Open MPI would
    otherwise busy-poll on the cores the ranks compute on); `mpirun --mca mpi_yield_when_idle 0` wins;
    the Gloo controller records nothing."""
    short = COMMON + MLP + ["--max-steps", "2"]
    chosen = tmp_path / "chosen"
    result = launch("horovodrun-mpi", 2, short + ["--run-dir", str(chosen)]).check()
    assert result.output.count("hvd_train: OMPI_MCA_mpi_yield_when_idle=1 (training on CPU") == 1
    backend = json.loads((chosen / "config.json").read_text())["backend"]
    assert (backend["mpi_yield_when_idle"], backend["mpi_yield_source"]) == ("1", "hvd_train: training on CPU")
    given = tmp_path / "given"
    cmd = command("mpirun", 2, short + ["--run-dir", str(given)])
    result = run_cmd(cmd[:1] + ["--mca", "mpi_yield_when_idle", "0"] + cmd[1:]).check()
    assert "OMPI_MCA_mpi_yield_when_idle=1" not in result.output
    backend = json.loads((given / "config.json").read_text())["backend"]
    assert (backend["mpi_yield_when_idle"], backend["mpi_yield_source"]) == ("0", "environment")
    gloo = runs("horovodrun-gloo", "baseline")["config"]["backend"]
    assert (gloo["mpi_yield_when_idle"], gloo["mpi_yield_source"]) == (None, None)
