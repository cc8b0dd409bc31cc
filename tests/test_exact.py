"""--reduction exact: the same bits on both backends and every launcher, at every world size that
divides the micro-batches, run after run, across a resume at another world size; every knob works
or is refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from launched import PY, compare_in_process, launch, read_run, run_cmd, step_losses
from settings import MLP_SGD, mlp_run
from common.rundir.names import SUMMARY_FILE

# The default global batch, 96, is 12 micro-batches of 8: 1, 2, 3, 4 (6, 12) ranks share them.
EXACT = ["--reduction", "exact", "--optimizer", "adam", "--lr", "0.002", "--weight-decay", "0.01", "--epochs", "1",
         "--max-steps", "6", "--log-every", "1", "--checkpoint-every", "3"]
BATCHNORM = EXACT + ["--model", "convnet"]
DROPOUT = EXACT + ["--model", "mnist_net"]
# Both backends and both Horovod controllers; mpirun starts the same ranks as horovodrun --mpi (exact mode under
# mpirun itself: test_plugins' transformer at 3 ranks).
THREE_RANKS = ("torchrun", "horovodrun-gloo", "horovodrun-mpi")
# Each world size through another launcher: the result depends on neither. BatchNorm's statistics over every world
# size up to 4 (4 ranks on Gloo, whose waiting ranks leave the cores to the others); dropout's masks, which follow
# each sample wherever it is computed, up to 3.
WORLD_SIZES = {"batchnorm": {1: "none-hvd", 2: "horovodrun-mpi", 3: "torchrun", 4: "horovodrun-gloo"},
               "dropout": {1: "none-ddp", 2: "torchrun", 3: "horovodrun-gloo"}}
ARGS = {"batchnorm": BATCHNORM, "dropout": DROPOUT}


def test_exact_mode_gives_the_same_bits_on_both_backends_and_controllers_at_3_ranks(runs):
    reference = runs("torchrun", 3, BATCHNORM).run
    assert reference["config"]["reduction"] == "exact" and reference["config"]["global_batch"] == 96
    assert reference["config"]["per_rank_batch"] == 32 and reference["config"]["micro_batches_per_step"] == 12
    assert reference["config"]["threads"] == 1
    for launcher in THREE_RANKS[1:]:
        other = runs(launcher, 3, BATCHNORM).run
        assert other["summary"]["world_size"] == 3
        assert other["summary"]["weights_sha256"] == reference["summary"]["weights_sha256"], launcher
        assert step_losses(other) == step_losses(reference), launcher
    # Weights and buffers: BatchNorm's running statistics are part of the checksum, and moved.
    state = reference["model"]
    assert "layer1.1.running_var" in state and not torch.equal(state["layer1.1.running_var"], torch.ones(16))


@pytest.mark.parametrize("model", ["batchnorm", "dropout"])
def test_exact_mode_gives_the_same_bits_at_every_world_size(runs, model):
    results = {np: runs(launcher, np, ARGS[model]).run for np, launcher in WORLD_SIZES[model].items()}
    digests = {np: r["summary"]["weights_sha256"] for np, r in results.items()}
    assert len(set(digests.values())) == 1, digests
    losses = {np: step_losses(r) for np, r in results.items()}
    assert all(loss == losses[1] for loss in losses.values())
    # The epoch's training metrics are global, the same at every world size.
    assert len({r["summary"]["train_loss"] for r in results.values()}) == 1


def test_exact_mode_resumes_mid_epoch_at_another_world_size(runs, tmp_path):
    """A checkpoint written at step 3 of a 3-rank run (mid-epoch: 14 steps make an epoch) continues on 2
    ranks and ends as the undisturbed run."""
    first = runs("torchrun", 3, BATCHNORM)
    run_dir = tmp_path / "run"
    shutil.copytree(first.dir, run_dir)
    for late in (run_dir / "checkpoints").glob("ckpt-*.pt"):
        if late.name != "ckpt-000000003.pt":
            late.unlink()
            late.with_name(late.name + ".sha256").unlink()
    result = launch("horovodrun-gloo", 2, BATCHNORM + ["--resume", "auto", "--run-dir", str(run_dir)]).check()
    assert "world size changed 3 -> 2 at step 3 (--reduction exact: the same global batches)" in result.output
    assert "resuming from" in result.output and "batch 3, step 3" in result.output
    resumed = read_run(run_dir)
    assert resumed["summary"]["weights_sha256"] == first.run["summary"]["weights_sha256"]
    assert step_losses(resumed) == step_losses(first.run)


def test_global_batch_sets_the_per_rank_batch(runs):
    """--global-batch 64 at 2 ranks is --batch-size 32: the same run, bit for bit."""
    args = [a for a in MLP_SGD]
    at = args.index("--batch-size")
    args[at:at + 2] = ["--global-batch", "64"]
    run = runs("torchrun", 2, args).run
    assert run["config"]["per_rank_batch"] == 32 and run["config"]["global_batch"] == 64
    assert run["summary"]["weights_sha256"] == mlp_run(runs, "torchrun").run["summary"]["weights_sha256"]


@pytest.mark.parametrize("extra,expected", [
    (["--compression", "fp16"], "--compression fp16 does not apply to --reduction exact"),
    (["--accumulate", "2"], "--accumulate does not apply to --reduction exact: it already cuts the global batch"),
    (["--lr-scaling", "linear"], "--lr-scaling linear does not apply to --reduction exact"),
    (["--predivide"], "--predivide does not apply to --reduction exact"),
    (["--batch-size", "16"], "--batch-size does not apply to --reduction exact"),
    (["--global-batch", "100"], "--global-batch 100 is not a multiple of --micro-batch 8"),
])
def test_exact_mode_refuses_what_cannot_work_in_one_line(tmp_path, extra, expected):
    result = run_cmd([PY, "-m", "hvd_train", "--reduction", "exact", *extra, "--run-dir", str(tmp_path)], timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output
    assert result.seconds < 10  # before torch is imported


def test_a_world_size_that_cannot_share_the_micro_batches_is_refused_on_every_rank(tmp_path):
    result = launch("torchrun", 2, ["--reduction", "exact", "--global-batch", "24", "--run-dir", str(tmp_path)],
                    timeout=90)
    assert result.returncode != 0
    for rank in range(2):
        assert f"[rank {rank}] ddp_train: error: --global-batch 24 makes 3 micro-batches of 8, which 2 ranks cannot " \
               "share equally" in result.output, result.output[-3000:]


def test_the_comparison_gives_the_world_size_verdict(runs, tmp_path):
    dirs = [runs(launcher, np, BATCHNORM).dir for np, launcher in WORLD_SIZES["batchnorm"].items()]
    result = compare_in_process("--runs", *dirs, "--out", tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    (verdict,) = summary["world_sizes"]
    assert verdict["identical"] and verdict["world_sizes"] == [1, 2, 3, 4]
    assert verdict["verdict"].startswith("world sizes 1, 2, 3, 4: bitwise identical")
    report = (tmp_path / "report.md").read_text()
    assert f"**World sizes** (--reduction exact): **{verdict['verdict']}**" in report


def test_fixed_point_sums_do_not_depend_on_their_grouping():
    """The integer form of a gradient sums to the same bits whichever ranks hold which micro-batches."""
    from common.exact.fixedpoint import FixedPoint, tensor_maxima

    gen = torch.Generator().manual_seed(0)
    # Magnitudes from 1e-8 to 1e2, each element its own.
    grads = [torch.randn(100, generator=gen) * 10.0 ** torch.randint(-8, 3, (100,), generator=gen) for _ in range(12)]
    fixed = FixedPoint([60, 40], micro_batches=12)
    maxima = torch.stack([tensor_maxima([g[:60], g[60:]]) for g in grads]).max(dim=0).values
    assert not fixed.fits(maxima)  # no scales yet: the first step measures them
    fixed.rescale(maxima)
    assert fixed.fits(maxima)
    integers = [fixed.to_integers(g) for g in grads]
    # Each element is round(g x 2**k) with its tensor's k, computed in float64: written out here.
    from common.exact.fixedpoint import HEADROOM_BITS, MAGNITUDE_BITS
    scale = torch.tensor([2.0 ** (MAGNITUDE_BITS - fixed.sum_bits - HEADROOM_BITS - e) for e in fixed.exponents],
                         dtype=torch.float64).repeat_interleave(torch.tensor([60, 40]))
    assert all(torch.equal(i, torch.round(g.double() * scale).to(torch.int64))
               for i, g in zip(integers, grads, strict=True))
    by_three = sum((sum(integers[i:i + 4]) for i in range(0, 12, 4)), torch.zeros(100, dtype=torch.int64))
    in_order = sum(integers, torch.zeros(100, dtype=torch.int64))
    assert torch.equal(by_three, in_order)
    # Added tensor by tensor in place (what a step does), the integers are the same.
    added = torch.zeros(100, dtype=torch.int64)
    for g in grads:
        fixed.add_integers([g[:60].view(6, 10), g[60:].view(4, 10)], added)
    assert torch.equal(added, in_order)
    # The largest magnitudes are the float32 values exactly, and a NaN is not lost in them.
    assert tensor_maxima([grads[0][:60]])[0] == grads[0][:60].abs().max().double()
    assert tensor_maxima([torch.tensor([1.0, float("nan")])]).isnan().all()
    mean = fixed.to_floats(in_order, 12)
    assert torch.equal(mean, (in_order.double() / scale / 12).float())
    into = [torch.empty(6, 10), torch.empty(4, 10)]  # written tensor by tensor in place, the same bits
    fixed.mean_into(in_order, 12, into)
    assert torch.equal(torch.cat([t.reshape(-1) for t in into]), mean)
    near_limit = torch.full((100,), 2 ** 62 - 1, dtype=torch.int64)  # int64 sums float64 must round
    fixed.mean_into(near_limit, 12, into)
    assert torch.equal(torch.cat([t.reshape(-1) for t in into]), (near_limit.double() / scale / 12).float())
    # The rounding is a fixed step per tensor: tiny against the tensor's largest value, whatever an element's size.
    error = (mean.double() - torch.stack(grads).double().mean(dim=0)).abs()
    assert error[:60].max() < 1e-8 * maxima[0] and error[60:].max() < 1e-8 * maxima[1]
    # A gradient 2**9 times larger than the scales allow is caught, not wrapped around.
    assert not fixed.fits(maxima * 2 ** 9)


def test_fixed_point_integers_are_those_of_float64_at_every_scale():
    """The integers are round(g x 2**k) in float64, half to even, whichever path makes them: float32 products for
    scales up to 2**127, float64 beyond either end (a tensor of tiny gradients, one of huge ones); written by a
    rank's first micro-batch, added by the others."""
    from common.exact.fixedpoint import FixedPoint, tensor_maxima

    gen = torch.Generator().manual_seed(1)
    tiny = torch.randn(50, generator=gen) * 2.0 ** -90  # k above 127
    huge = torch.randn(50, generator=gen) * 2.0 ** 60  # k below 0
    plain = torch.randn(50, generator=gen) * 10.0 ** torch.randint(-40, 1, (50,), generator=gen)  # subnormals too
    fixed = FixedPoint([50, 50, 50], micro_batches=4)
    fixed.rescale(tensor_maxima([tiny, huge, plain]))
    ks = fixed._ks()
    assert ks[0] > 127 and ks[1] < 0 and 0 <= ks[2] <= 127, ks
    # Halves at the scale: the ties that rounding to even decides, and the float32 neighbours of them.
    step = 2.0 ** -ks[2]
    plain[:6] = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 3.5]) * step
    plain[6:8] = torch.nextafter(plain[:2], torch.zeros(2))
    grads = [tiny, huge, plain]
    expected = torch.cat([torch.round(g.double() * 2.0 ** k).to(torch.int64) for g, k in zip(grads, ks, strict=True)])
    written = torch.full((150,), 7, dtype=torch.int64)  # whatever was there before
    fixed.add_integers(grads, written, first=True)
    assert torch.equal(written, expected)
    assert written[100:106].tolist() == [0, 2, 2, 0, -2, 4]
    fixed.add_integers(grads, written)
    assert torch.equal(written, 2 * expected)


def test_the_integer_sums_start_bucket_by_bucket_while_the_last_backward_runs():
    """In a rank's last micro-batch the integer sums start bucket by bucket, from the last layers back, before
    backward has finished the first layers' gradients; they cover the integers once, in the same order every
    step, and the step's gradients have the bits of the same integers made after backward, micro-batch by
    micro-batch (one rank, in process: the launched tests above hold the bits across ranks and backends)."""
    from types import SimpleNamespace

    from common.config import Config
    from common.exact.fixedpoint import FixedPoint
    from common.exact.step import ExactStep
    from common.loop.backend import LocalBackend
    from common.loop.metrics import SumMeter
    from common.loop.precision import Precision

    class Recording(LocalBackend):
        """One rank that records each integer sum it starts: its elements, and the gradients still missing."""

        def __init__(self) -> None:
            super().__init__()
            self.step, self.started, self.waited = None, [], 0

        def _started_all_reduce(self, tensor):
            if tensor.dtype == torch.int64:
                self.started.append((tensor.numel(), self.step._micro.added.count(False)))

            def wait() -> None:
                self.waited += 1

            return wait

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 4))

    # Tensors of 1024, 64, 4096, 64, 256 and 4 elements in buckets of at least 300: [64, 256, 4], [4096], [1024, 64].
    config = Config(reduction="exact", micro_batch=4, bucket_mb=300 * 8 / 2**20)
    model, backend = mlp(), Recording()
    step = ExactStep(model, torch.optim.SGD(model.parameters(), lr=0.1), backend, Precision("off", backend.device),
                     config, SimpleNamespace(micro_batches=4))
    backend.step = step
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 16, generator=gen), torch.randint(0, 4, (16,), generator=gen)) for _ in range(2)]
    meter = SumMeter(["loss", "correct"], backend.device)
    step([batches[0]], meter, 0)  # the first step measures the scales, and sums once it has them
    assert [size for size, _ in backend.started] == [324, 4096, 1088]
    assert backend.started[0][1] > 0 and backend.started[1][1] > 0  # started while gradients were still missing

    scales, weights = list(step.fixed.exponents), {k: v.clone() for k, v in model.state_dict().items()}
    backend.started, backend.waited = [], 0
    step([batches[1]], meter, 1)
    assert [size for size, _ in backend.started] == [324, 4096, 1088] and backend.waited == 3 + 1  # and the vector

    reference = mlp()
    reference.load_state_dict(weights)
    fixed = FixedPoint([p.numel() for p in reference.parameters()], 4)
    fixed.exponents = scales
    total = torch.zeros(sum(p.numel() for p in reference.parameters()), dtype=torch.int64)
    for i, (x, y) in enumerate(zip(batches[1][0].split(4), batches[1][1].split(4), strict=True)):
        reference.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        fixed.add_integers([p.grad for p in reference.parameters()], total, first=i == 0)
    expected = [torch.empty_like(p) for p in reference.parameters()]
    fixed.mean_into(total, 4, expected)
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected, strict=True))
