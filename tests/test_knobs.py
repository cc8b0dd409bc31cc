"""Tuning knobs and profiling: the same flag on both backends, recorded in config.json, bitwise parity
at world size 2 for every knob that does not change the numbers differently on the two backends."""

from __future__ import annotations

import json
import re

import pytest
import torch

from launched import PY, launch, max_abs_diff, run_cmd, step_losses
from settings import CONVNET_ADAM, COMMON, KNOBS, convnet_run, mlp_run
from common.rundir.names import CONFIG_FILE, SUMMARY_FILE

FP16 = COMMON + ["--model", "mlp", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--compression", "fp16"]
DETERMINISTIC = CONVNET_ADAM + ["--max-steps", "12", "--deterministic"]
#: horovodrun's own option for the cycle time: what the user sets wins over hvd_train's choice
HOROVODRUN_CYCLE = ("--cycle-time-ms", "2")


def knobs(runs, launcher):
    return runs(launcher, 2, KNOBS)


def deterministic(runs, again=False):
    """A --deterministic run of Horovod at 3 ranks; `again`, another launch of it, given horovodrun's own cycle
    time (its timing, not its numbers)."""
    return runs("horovodrun-gloo", 3, DETERMINISTIC, HOROVODRUN_CYCLE if again else ())


def test_knobs_keep_world_size_2_parity(runs):
    ddp, hvd = knobs(runs, "torchrun").run, knobs(runs, "horovodrun-gloo").run
    assert step_losses(hvd) == step_losses(ddp)
    assert hvd["summary"]["weights_sha256"] == ddp["summary"]["weights_sha256"]
    assert len(step_losses(ddp)) == 16
    for run in (ddp, hvd):
        config = run["config"]["config"]
        assert (config["channels_last"], config["bucket_mb"], config["clip_grad_norm"], config["accumulate"],
                config["amp"], config["profile"]) == (True, 0.001, 0.05, 2, "bf16", 3)
        assert run["config"]["precision"] == {"amp": "bf16", "autocast_dtype": "bfloat16", "grad_scaler": False}
    # The knobs acted: the same run without them ends elsewhere.
    assert ddp["summary"]["weights_sha256"] != convnet_run(runs, "torchrun").run["summary"]["weights_sha256"]


def test_bucket_size_reaches_both_backends(runs):
    """What each backend got, as it reports it: DDP's own record of its reducer's bucket caps,
    and the HOROVOD_FUSION_THRESHOLD this process handed Horovod at init; not the option they were given."""
    ddp, hvd = knobs(runs, "torchrun").run["config"], knobs(runs, "horovodrun-gloo").run["config"]
    small = int(0.001 * 1024 * 1024)
    assert ddp["backend"]["ddp_built"]["bucket_cap_bytes"] == small
    assert ddp["backend"]["ddp_built"]["first_bucket_cap_bytes"] == small  # a size DDP is given caps its first too
    assert hvd["backend"]["fusion_threshold_env"] == str(small)
    # The default matches DDP's own: 25 MB on both.
    built = mlp_run(runs, "torchrun").run["config"]["backend"]["ddp_built"]
    assert built["bucket_cap_bytes"] == 25 * 1024 * 1024
    # At the default DDP is given nothing, so it keeps its own small first bucket (communication starts early).
    assert built["first_bucket_cap_bytes"] == 1024 * 1024
    assert mlp_run(runs, "horovodrun-gloo").run["config"]["backend"]["fusion_threshold_env"] == str(25 * 1024 * 1024)


def test_accumulation_counts_optimizer_steps(runs):
    run = knobs(runs, "torchrun").run
    # 23 micro-batches per rank and epoch: 11 steps, the 23rd micro-batch dropped.
    assert run["config"]["steps_per_epoch"] == 11
    assert run["config"]["global_batch"] == 32 * 2 * 2 and run["config"]["micro_batches_per_step"] == 2
    assert knobs(runs, "horovodrun-gloo").run["config"]["backend"]["backward_passes_per_step"] == 2
    assert run["config"]["backend"]["accumulate"] == 2
    steps = [e for e in run["events"] if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 17))
    assert all(e["batch"] == 64 for e in steps)  # samples of rank 0 in one step


def test_accumulation_equals_the_larger_batch(tmp_path):
    """K micro-batches of B samples average the gradient of one batch of K x B (the same samples in
    the same order), up to float rounding: the loss is divided by K on both backends."""
    args = ["--model", "mlp", "--dataset", "digits", "--max-steps", "8", "--threads", "1", "--lr", "0.1"]
    launch("horovodrun-gloo", 2, args + ["--batch-size", "64", "--run-dir", str(tmp_path / "big")]).check()
    launch("horovodrun-gloo", 2, args + ["--batch-size", "32", "--accumulate", "2",
                                         "--run-dir", str(tmp_path / "acc")]).check()
    from launched import read_run
    big, acc = read_run(tmp_path / "big"), read_run(tmp_path / "acc")
    assert max_abs_diff(big["model"], acc["model"]) < 1e-5
    assert step_losses(big) == pytest.approx(step_losses(acc), abs=1e-5)


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-gloo"])
def test_fp16_compression_acts_and_is_recorded(runs, launcher):
    run, plain = runs(launcher, 2, FP16).run, mlp_run(runs, launcher).run
    assert run["config"]["config"]["compression"] == "fp16"
    backend = run["config"]["backend"]
    assert backend["compression"] == "fp16"
    if launcher == "torchrun":
        assert backend["comm_hook"] == "fp16_compress_hook"
    # Float16 gradients: close to the float32 run, and not equal to it (the compression acted).
    diff = max_abs_diff(run["model"], plain["model"])
    assert 0 < diff < 1e-2
    assert all(loss == loss for loss in step_losses(run))


def test_fp16_compression_across_backends(runs):
    """Not bitwise: DDP halves in float16 before the sum, Horovod after it. Close all the same."""
    assert max_abs_diff(runs("torchrun", 2, FP16).run["model"], runs("horovodrun-gloo", 2, FP16).run["model"]) < 1e-3


FP16_CPU_ERROR = "--amp fp16 needs a CUDA device"


@pytest.mark.parametrize("launcher,np,device", [("none-ddp", 1, "cpu"), ("none-ddp", 1, "auto"),
                                                ("torchrun", 2, "cpu"), ("horovodrun-gloo", 2, "auto")])
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
    assert not (tmp_path / "run" / SUMMARY_FILE).exists()


def _horovod_timeline(path):
    """Horovod writes its timeline as a JSON array that is closed only at shutdown, if at all."""
    text = path.read_text().strip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return json.loads(text)


def test_profile_writes_a_trace_on_both_backends(runs):
    ddp_dir, hvd_dir = knobs(runs, "torchrun").dir, knobs(runs, "horovodrun-gloo").dir
    config = json.loads((ddp_dir / CONFIG_FILE).read_text())
    assert config["profile"]["steps"] == 3
    assert config["profile"]["file"].endswith("profile/ddp-rank0.pt.trace.json")
    events = json.loads((ddp_dir / "profile" / "ddp-rank0.pt.trace.json").read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    # One ProfilerStep span per traced optimizer step, and the gradient allreduce inside them.
    assert sum(name.startswith("ProfilerStep#") for name in names) == 3, sorted(names)[:50]
    assert any("allreduce" in name.lower() for name in names)
    assert not (ddp_dir / "profile" / "ddp-rank1.pt.trace.json").exists()
    timeline = _horovod_timeline(hvd_dir / "profile" / "horovod-timeline.json")
    assert isinstance(timeline, list) and any("ALLREDUCE" in json.dumps(e) for e in timeline)


def test_help_lists_the_knobs_on_both_entry_points():
    for module in ("ddp_train", "hvd_train"):
        text = run_cmd([PY, "-m", module, "--help"], timeout=60).check().output
        for option in ("--compression", "--bucket-mb", "--accumulate", "--amp", "--clip-grad-norm",
                       "--channels-last", "--profile", "--reduction", "--global-batch", "--micro-batch",
                       "--deterministic", "--predivide"):
            assert option in text, (module, option)
        assert re.search(r"128\s+MB", text)  # Horovod's own fusion default, next to ours


def test_grad_scaler_state_survives_a_checkpoint(tmp_path):
    """The GradScaler's state (--amp fp16, CUDA only for training) goes through the checkpoint format:
    saved with the checkpoint, loaded with weights_only=True, restored into a fresh scaler. Run on
    CPU in-process, since only the state's round trip is under test."""
    from common.loop.backend import LocalBackend
    from common.checkpoints.format import atomic_save, verified_load
    from common.loop.precision import Precision

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


def test_horovod_cycle_time_follows_the_model_size_and_controller_unless_the_user_sets_it(runs, tmp_path):
    """On CPU, a model with at least 16 MB of gradients gets a longer Horovod cycle (its background thread then
    takes less of the cores the ranks compute on): 20 ms under the Gloo controller, 5 ms under MPI's; a small
    one Horovod's own 1 ms, and `horovodrun --cycle-time-ms` (HOROVOD_CYCLE_TIME) always wins."""
    small = mlp_run(runs, "horovodrun-gloo").run["config"]["backend"]
    assert (small["cycle_time_ms"], small["cycle_time_source"]) == (1.0, "Horovod's default")
    given = deterministic(runs, again=True).run["config"]["backend"]  # started with horovodrun --cycle-time-ms 2
    assert (given["cycle_time_ms"], given["cycle_time_source"]) == (2.0, "environment")
    resnet = ["--model", "resnet18", "--dataset", "synthetic", "--image-size", "32", "--synthetic-samples", "64",
              "--batch-size", "4", "--epochs", "1", "--max-steps", "1", "--threads", "1"]
    for launcher, controller, cycle_ms in (("none-hvd", "mpi", 5), ("horovodrun-gloo", "gloo", 20)):
        run_dir = tmp_path / launcher
        result = launch(launcher, 1, [*resnet, "--run-dir", str(run_dir)]).check()
        assert result.output.count(f"hvd_train: HOROVOD_CYCLE_TIME={cycle_ms} (the model has 43 MB of gradients "
                                   f"and trains on CPU, {controller} controller)") == 1, result.output[-2000:]
        backend = json.loads((run_dir / CONFIG_FILE).read_text())["backend"]
        assert backend["controller"] == controller
        assert (backend["cycle_time_ms"], backend["cycle_time_source"]) == \
            (float(cycle_ms), f"hvd_train: 43 MB of gradients on CPU, {controller} controller")


def test_open_mpi_settings_follow_the_job_unless_the_user_sets_them(runs):
    """Under Open MPI on CPU hvd_train makes idle ranks yield the core (Open MPI would busy-poll on the
    cores the ranks compute on) and, with every rank on this host, keeps Open MPI to shared memory (its
    TCP transport would listen on every interface); `mpirun --mca ...` wins; Gloo records nothing."""
    chosen = mlp_run(runs, "horovodrun-mpi")
    assert chosen.result.output.count("hvd_train: OMPI_MCA_mpi_yield_when_idle=1 (training on CPU") == 1
    backend = chosen.run["config"]["backend"]
    assert (backend["mpi_yield_when_idle"], backend["mpi_yield_source"]) == ("1", "hvd_train: training on CPU")
    assert (backend["mpi_btl"], backend["mpi_btl_source"]) == ("self,vader", "hvd_train: every rank on this host")
    given = mlp_run(runs, "mpirun")  # started with mpirun --mca mpi_yield_when_idle 0
    assert "OMPI_MCA_mpi_yield_when_idle=1" not in given.result.output
    backend = given.run["config"]["backend"]
    assert (backend["mpi_yield_when_idle"], backend["mpi_yield_source"]) == ("0", "environment")
    gloo = mlp_run(runs, "horovodrun-gloo").run["config"]["backend"]
    assert (gloo["mpi_yield_when_idle"], gloo["mpi_yield_source"], gloo["mpi_btl"]) == (None, None, None)


def test_deterministic_horovod_repeats_its_bits_at_3_ranks(runs):
    """--deterministic: Horovod reduces every tensor alone (no fusion, whose grouping follows timing), so two
    runs at 3 ranks, where the grouping of a sum changes its bits, end with the same weights."""
    first, again = deterministic(runs).run, deterministic(runs, again=True).run
    assert first["summary"]["weights_sha256"] == again["summary"]["weights_sha256"]
    for run in (first, again):
        backend = run["config"]["backend"]
        assert run["config"]["config"]["deterministic"] is True and backend["deterministic"] is True
        # what Horovod read at init: no fusion
        assert backend["fusion_threshold_env"] == "0" and backend["fusion_threshold_bytes"] == 0
    # The control, the shared convnet run at 3 ranks, without --deterministic: Horovod fuses (its repeats may
    # differ, so only what it was handed is compared); had --deterministic done nothing, the two would read the same.
    control = convnet_run(runs, "horovodrun-gloo", np=3).run["config"]["backend"]
    assert control["deterministic"] is False
    assert control["fusion_threshold_env"] == str(25 * 1024 * 1024)
    assert control["fusion_threshold_env"] != first["config"]["backend"]["fusion_threshold_env"]
