"""Verdicts judged where a divergence starts, against a noise floor of several disturbed runs: the default
comparison at 3 ranks (make demo's training) is never "beyond" it; a 20% higher learning rate under Adam is beyond it
from step 2, and runs with different settings are never called repeats; a 10% higher learning rate and fp16
compression are beyond it; the numbers a verdict gives are what the run directories hold, computed here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest
import torch

# The first test's setup can be make demo's comparison, minutes while another worker runs too.
pytestmark = pytest.mark.timeout(900)

from launched import compare_in_process, read_run
from settings import DEMO
from test_compare import assert_real_image, compare
from common.rundir.names import SUMMARY_FILE

#: Adam where a 20% higher learning rate ends "within" a one-sample floor of final weights
ADAM = ["--model", "convnet", "--dataset", "digits", "--optimizer", "adam", "--batch-size", "12", "--seed", "31",
        "--epochs", "1", "--threads", "1"]


def losses(run: dict) -> dict:
    return {e["step"]: e["loss"] for e in run["events"] if e["event"] == "step"}


def relative_gaps(a: dict, b: dict) -> dict:
    la, lb = losses(a), losses(b)
    return {s: abs(la[s] - lb[s]) / max(abs(la[s]), abs(lb[s])) for s in la}


def first_event(run: dict, kind: str) -> dict:
    return next(e for e in run["events"] if e["event"] == kind)


def pair_gaps(a: dict, b: dict) -> dict:
    """Per step, the relative gap of the loss and the largest of the weights' fingerprint (the norms logged after
    the step before, or at the start), as a user would compute them from metrics.jsonl."""
    def fingerprints(run):
        steps = {e["step"]: e["wnorm"] for e in run["events"] if e["event"] == "step"}
        return {s + 1: w for s, w in [(0, first_event(run, "start")["wnorm"]), *steps.items()]}

    def relative(x, y):  # a tensor whose norm is zero in both (a bias that starts at 0) has no gap
        return abs(x - y) / max(abs(x), abs(y)) if x != y else 0.0

    fa, fb = fingerprints(a), fingerprints(b)
    weights = {s: max(relative(x, y) for x, y in zip(fa[s], fb[s])) for s in fa if s in fb}
    return {"loss": relative_gaps(a, b), "weights": weights}


def first_departure(base: dict, other: dict, disturbed: list, margin: float) -> int:
    """The first step where a gap of `other` is more than `margin` times the band of the disturbed runs."""
    pair = pair_gaps(base, other)
    floors = [pair_gaps(base, d) for d in disturbed]
    leaves = []
    for quantity in ("loss", "weights"):
        level = 2.0 ** -23
        for step in sorted(pair[quantity]):
            level = max([level] + [f[quantity][step] for f in floors if step in f[quantity]])
            if pair[quantity][step] > margin * level:
                leaves.append(step)
                break
    return min(leaves)


def judged_loss_band(pair: dict, floors: list, margin: float, first: int) -> dict:
    """Per step, what a pair's loss gap is judged against: the largest gap any disturbed run has reached by then;
    once the pair's gap, after differing at rounding's size first, passes margin x float32's last bit (its branch),
    at least what the disturbed runs reach as many steps after they passed it."""
    def branch(gaps):
        return next((s for s in sorted(gaps) if gaps[s] > margin * 2.0 ** -23), None)

    aligned = [{s - branch(g): v for s, v in g.items() if s >= branch(g)} for g in floors if branch(g) is not None]
    start = branch(pair)
    out, level = {}, 2.0 ** -23
    for step in sorted(pair):
        level = max([level] + [g[step] for g in floors])
        out[step] = level
        if aligned and start is not None and start > first and step >= start:
            out[step] = max(level, max(v for a in aligned for n, v in a.items() if n <= step - start))
    return out


def test_the_default_comparison_at_3_ranks_is_never_beyond_the_floor(demo):
    """make demo's comparison (conftest.demo) at seed 42, the default (seeds 7 and 123 of the same training are pairs
    of the committed corpus, benchmarks/results/verdicts.json)."""
    out, _, summary = demo
    (pair,) = [p for p in summary["parity"] if (p["a"], p["b"]) == ("ddp@3#1", "horovod-gloo@3#1")]
    assert pair["within_noise_floor"] is not False and pair["trains_differently_from"] is None, pair["verdict"]
    assert pair["verdict"].startswith(("bitwise identical", "equal within", "within the noise floor")), pair["verdict"]
    runs = {r["name"]: read_run(r["path"]) for r in summary["runs"]}
    if pair["bitwise_identical"]:
        # No floor is made where the backends agree to the bit; at 3 ranks Horovod/MPI's run is a cell too.
        cells = {runs[name]["summary"]["weights_sha256"] for name in ("ddp@3#1", "horovod-gloo@3#1", "horovod-mpi@3#1")}
        assert ("3" in summary["noise_floors"]) == (len(cells) > 1)
        return
    # The floor: the default number of disturbed runs, each its own pattern, against undisturbed DDP.
    floor = summary["noise_floors"]["3"]
    disturbed = [name for name in runs if "+perturbed" in name]
    assert sorted(floor["disturbed"]) == sorted(disturbed) and len(disturbed) == floor["runs"] >= 2
    patterns = sorted(runs[name]["config"]["config"]["perturb_pattern"] for name in disturbed)
    assert patterns == list(range(1, len(disturbed) + 1))
    # The band and the pair's largest ratio to it, from the run directories' losses, computed here.
    ddp, hvd = runs["ddp@3#1"], runs["horovod-gloo@3#1"]
    floor_gaps = [relative_gaps(ddp, runs[name]) for name in disturbed]
    pair_gaps = relative_gaps(ddp, hvd)
    band = judged_loss_band(pair_gaps, floor_gaps, summary["floor_margin"], pair["first_differing_step"])
    largest = max(pair_gaps[s] / band[s] for s in pair_gaps)
    assert largest <= summary["floor_margin"]
    if pair["largest_band_ratio"]["quantity"] == "loss":
        assert pair["largest_band_ratio"]["ratio"] == pytest.approx(largest)
    assert pair["max_rel_loss_diff"] == pytest.approx(max(pair_gaps.values()))
    # Where the floor's branches raise the level above the band, summary.json gives that level (parity.png draws it).
    plain = judged_loss_band(pair_gaps, floor_gaps, summary["floor_margin"], first=max(pair_gaps))
    from_branches = {s: band[s] for s in band if band[s] > plain[s] * (1 + 1e-9)}
    recorded = {int(s): v for s, v in pair["branch_levels"].get("loss", {}).items()}
    assert recorded.keys() == from_branches.keys()
    assert all(recorded[s] == pytest.approx(from_branches[s]) for s in recorded)
    report = (out / "report.md").read_text()
    assert f"**{pair['verdict']}**" in report and "### Noise floor" in report
    assert_real_image(out / "parity.png")


@pytest.fixture(scope="module")
def adam_lr(runs, tmp_path_factory):
    """Two DDP runs at 2 ranks under Adam, lr 0.001 and 0.0012, compared with --runs --force (the floor made by
    rerunning the first): (the two runs, the output folder, what the comparison printed, its summary)."""
    a, b = runs("torchrun", 2, ADAM + ["--lr", "0.001"]), runs("torchrun", 2, ADAM + ["--lr", "0.0012"])
    out = tmp_path_factory.mktemp("adam-lr")
    result = compare("--runs", a.dir, b.dir, "--out", out, "--force", timeout=600)
    assert result.returncode == 0, result.output[-3000:]
    return a, b, out, result.output, json.loads((out / SUMMARY_FILE).read_text())


def test_a_20_percent_higher_learning_rate_under_adam_is_beyond_the_floor_from_step_2(adam_lr):
    a, b, out, output, summary = adam_lr
    (pair,) = [p for p in summary["parity"] if p["kind"] != "repeat"]
    assert (pair["a"], pair["b"]) == ("ddp[lr=0.001]@2#1", "ddp[lr=0.0012]@2#1")
    assert pair["kind"] == "settings"
    assert pair["within_noise_floor"] is False and pair["trains_differently_from"] == 2, pair["verdict"]
    assert pair["verdict"].startswith("beyond the noise floor: trains differently from step 2")
    assert "the learning rate differs from step 1 (0.001 vs 0.0012)" in pair["verdict"]
    # From step 2 the loss is orders of magnitude further apart than rounding ever carries it here.
    gaps = relative_gaps(a.run, b.run)
    assert gaps[1] == 0 and gaps[2] > 1e-3
    floor = summary["noise_floors"]["2"]
    assert max(max(p["steps"]["loss"].values()) for p in floor["pairs"]) < 1e-4
    assert f"weights @2: ddp[lr=0.001]@2#1 vs ddp[lr=0.0012]@2#1: {pair['verdict']}" in output


def test_runs_whose_settings_differ_are_never_called_repeats(adam_lr):
    _, _, out, output, summary = adam_lr
    assert not [p for p in summary["parity"] if p["kind"] == "repeat"]
    assert "Reproducibility" not in (out / "report.md").read_text()
    # The floor was made here from the first run's recorded settings, in as many patterns as the default asks.
    assert "rerunning ddp[lr=0.001]@2#1's settings here with --perturb-ulp 1" in output
    made = sorted(p for p in (out / "runs").iterdir() if p.is_dir())
    assert [read_run(p)["config"]["config"]["perturb_pattern"] for p in made] == list(range(1, len(made) + 1))
    assert all(read_run(p)["config"]["config"]["lr"] == 0.001 for p in made)


@pytest.fixture(scope="module")
def demo_floor(demo):
    """make demo's DDP run at 3 ranks and the disturbed runs of its noise floor there: (run dir, [run dirs])."""
    _, _, summary = demo
    dirs = {r["name"]: Path(r["path"]) for r in summary["runs"]}
    return dirs["ddp@3#1"], sorted(path for name, path in dirs.items() if name.startswith("ddp+perturbed"))


def test_a_learning_rate_10_percent_higher_is_beyond_the_floor(runs, demo_floor, tmp_path):
    base_dir, disturbed = demo_floor
    faster = runs("horovodrun-gloo", 3, DEMO + ["--lr", "0.055"])  # the default 0.05, 10% higher
    result = compare_in_process("--runs", base_dir, faster.dir, *disturbed, "--out", tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    (pair,) = [p for p in summary["parity"] if p["kind"] == "backends"]
    assert pair["within_noise_floor"] is False and pair["trains_differently_from"] == 2, pair["verdict"]
    assert pair["lr_difference"] == {"step": 1, "a": 0.05, "b": 0.055}
    # The departure's numbers are what the run directories hold, computed here.
    base = read_run(base_dir)
    assert first_event(faster.run, "start")["wnorm"] == first_event(base, "start")["wnorm"]
    departure = pair["departure"]
    gaps = pair_gaps(base, faster.run)[departure["quantity"]]
    assert departure["step"] == 2 and departure["gap"] == pytest.approx(gaps[2])
    assert departure["ratio"] > summary["floor_margin"]


def test_fp16_compression_on_one_side_is_beyond_the_floor_of_given_disturbed_runs(runs, demo_floor, tmp_path):
    base_dir, disturbed = demo_floor
    compressed = runs("horovodrun-gloo", 3, DEMO + ["--compression", "fp16"])
    result = compare_in_process("--runs", base_dir, compressed.dir, *disturbed, "--out", tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    assert "rerunning" not in result.output and not (tmp_path / "runs").exists()  # the floor was given
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    (pair,) = [p for p in summary["parity"] if p["kind"] == "backends"]
    assert (pair["a"], pair["b"]) == ("ddp@3#1", "horovod-gloo@3#1")
    assert summary["noise_floors"]["3"]["runs"] == len(disturbed)
    assert pair["within_noise_floor"] is False and pair["lr_difference"] is None, pair["verdict"]
    # fp16 rounding of the gradients acts from the first update: the weights differ at step 2, and the pair leaves
    # the band there or a step or two later, as the difference grows past the margin.
    assert pair["first_differing_step"] == 2
    expected = first_departure(read_run(base_dir), compressed.run, [read_run(d) for d in disturbed],
                               summary["floor_margin"])
    assert pair["trains_differently_from"] == expected <= 4, pair["verdict"]
    assert "compression" in summary["setting_differences"]


@pytest.fixture(scope="module")
def fp16_both(tmp_path_factory):
    """--compression fp16 on both backends at 2 and 3 ranks, Horovod with Gloo and (at 3) MPI: the summary."""
    out = tmp_path_factory.mktemp("fp16-both")
    result = compare("--np", "2,3", "--compression", "fp16", "--epochs", "1", "--repeats", "1", "--explain", "none",
                     "--floor-runs", "2", *DEMO, "--out", out, timeout=600)
    assert result.returncode == 0, result.output[-3000:]
    return json.loads((out / SUMMARY_FILE).read_text())


def test_fp16_compression_on_both_backends_is_judged_against_float16s_rounding(fp16_both):
    """Both send float16 gradients, grouped otherwise (DDP divides before compressing, Horovod after the sum): apart
    from the first update at every world size, Gloo against MPI too, and never beyond a floor that rounds there."""
    pairs = [p for p in fp16_both["parity"] if p["kind"] == "backends"]
    assert {(p["a"], p["b"]) for p in pairs} == {("ddp@2#1", "horovod-gloo@2#1"), ("ddp@3#1", "horovod-gloo@3#1"),
                                                  ("ddp@3#1", "horovod-mpi@3#1"),
                                                  ("horovod-gloo@3#1", "horovod-mpi@3#1")}
    for pair in pairs:
        assert pair["within_noise_floor"] is not False and pair["trains_differently_from"] is None, pair["verdict"]
    for world in ("2", "3"):  # the floor's disturbed runs moved their gradients by float16's unit
        assert fp16_both["noise_floors"][world]["band"]["weights"]["2"] > 1e-5


def test_a_floor_that_is_off_is_said_to_be_unknown(runs, demo_floor, tmp_path):
    base_dir, _ = demo_floor
    faster = runs("horovodrun-gloo", 3, DEMO + ["--lr", "0.055"])
    result = compare_in_process("--runs", base_dir, faster.dir, "--out", tmp_path, "--noise-floor", "off")
    assert result.returncode == 0, result.output[-3000:]
    (pair,) = [p for p in json.loads((tmp_path / SUMMARY_FILE).read_text())["parity"] if p["kind"] == "backends"]
    assert pair["verdict"].startswith("differs: parameters by ")
    assert "the learning rate differs from step 1 (0.05 vs 0.055)" in pair["verdict"]
    assert pair["verdict"].endswith("noise floor unknown (--noise-floor off)")
    assert pair["noise_floor"] is None and pair["within_noise_floor"] is None and not (tmp_path / "runs").exists()


def test_disturbance_patterns_move_every_nonzero_initial_weight_one_ulp_each_tensor_its_own_way():
    from common.inputs.perturb import directions, perturb_ulp

    def disturbed(pattern):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        perturb_ulp(model, 1, pattern)
        return model, before

    seen = set()
    for pattern in (1, 2, 3, 4, 5):
        model, before = disturbed(pattern)
        ways = directions(pattern, len(list(model.parameters())))
        for (name, param), away in zip(model.named_parameters(), ways):
            was, moved = before[name], param.detach()
            nonzero = was != 0
            assert torch.equal(moved[~nonzero], was[~nonzero])  # zeros stay
            target = torch.where(was > 0, torch.inf, -torch.inf) if away else torch.zeros_like(was)
            assert torch.equal(moved[nonzero], torch.nextafter(was, target)[nonzero])  # one ulp, that way
        assert torch.equal(model[1].running_var, before["1.running_var"])  # buffers untouched
        seen.add(tuple(ways))
    assert directions(1, 6) == [True] * 6 and directions(2, 6) == [False] * 6
    assert len(seen) >= 4  # distinct disturbances


def _trajectory(steps: int, branch: Optional[int] = None, start: float = 1e-5, growth: float = 1.5,
                jump: Optional[float] = None) -> dict:
    """Made-up per-step gaps of the loss, the weights at rounding's size: rounding's size (1e-7) from step 2, then
    from `branch` on a branch that starts at `start` and grows by `growth` a step up to 1e-2, or a jump to `jump`."""
    loss = {1: 0.0}
    for step in range(2, steps + 1):
        if branch is not None and step >= branch:
            loss[step] = jump if jump is not None else min(start * growth ** (step - branch), 1e-2)
        else:
            loss[step] = 1e-7
    return {"loss": loss, "weights": {step: 1e-7 if step > 1 else 0.0 for step in range(1, steps + 1)}}


def _judge(pair: dict, floor_runs: list, margin: float = 30.0):
    """What the comparison's code makes of made-up gaps: (judged_band, the departure with its branch, or None)."""
    from common.compare import branches, trajectory
    floor = {"band": trajectory.band(floor_runs), "pairs": [{"steps": g} for g in floor_runs]}
    judged = branches.judged_band(pair, floor, margin)
    departure = trajectory.departure(pair, branches.levels(judged), margin)
    return judged, departure and {**departure, "branch": branches.branch_of(departure, judged)}


def test_a_same_training_branch_that_starts_before_every_disturbed_run_is_within_the_floor():
    """Training branches at a moment that is chance: a pair can branch steps before any disturbed run does. It is
    judged from where it branches against how the floor's runs grow after theirs, not against the band by then."""
    floor_runs = [_trajectory(120, branch=40), _trajectory(120, branch=90), _trajectory(120)]
    pair = _trajectory(120, branch=25)
    judged, departure = _judge(pair, floor_runs)
    assert departure is None and judged["loss"]["branch"] == 25 and judged["loss"]["needed"]
    # Step by step against the band, the same pair reads as beyond it where it branches.
    from common.compare import branches, trajectory
    band = trajectory.band(floor_runs)["loss"]
    assert pair["loss"][25] > 30 * band[25]
    # What summary.json records (and parity.png draws): from step 25 on, the level of the floor's branches as many
    # steps after theirs started, where that is above the band; never before the pair's own branch.
    recorded = branches.branch_levels(judged)["loss"]
    assert min(recorded) == 25 and all(recorded[s] > band[s] for s in recorded)
    assert recorded == {s: judged["loss"]["levels"][s] for s in judged["loss"]["from_branches"]}
    assert recorded[25] == pytest.approx(floor_runs[0]["loss"][40])  # the earliest branch's own start
    # A branch that grows faster than any of the floor's is beyond it, where it outgrows them.
    fast = _trajectory(120, branch=25, growth=3.0)
    _, departure = _judge(fast, floor_runs)
    assert departure is not None and departure["branch"] == 25 and departure["step"] > 25
    assert departure["ratio"] > 30


def test_a_real_difference_that_acts_late_is_beyond_the_floor_where_it_jumps():
    """A change that acts at step 60 (a schedule, an augmentation from the second epoch) after the pair differed by
    rounding does not grow from rounding's size: it jumps, beyond what the floor's branches start from."""
    floor_runs = [_trajectory(120, branch=90), _trajectory(120), _trajectory(120)]
    _, departure = _judge(_trajectory(120, branch=60, jump=5e-3), floor_runs)
    assert departure["step"] == 60 and departure["branch"] == 60 and departure["ratio"] == pytest.approx(500.0)
    # A difference large from the pair's first differing step is judged against the band there: no branch excuses it.
    early = _trajectory(120)
    early["loss"][2] = 1e-5
    _, departure = _judge(early, floor_runs)
    assert departure["step"] == 2 and departure["branch"] is None
    assert departure["ratio"] == pytest.approx(1e-5 / 2 ** -23)
    # With no disturbed run that branches, the band is all there is.
    flat = [_trajectory(120), _trajectory(120)]
    _, departure = _judge(_trajectory(120, branch=25), flat)
    assert departure["step"] == 25 and departure["branch"] is None


def test_parity_figure_draws_the_level_a_branching_pair_is_judged_against():
    """parity.png: `margin` times the floor's branches, dashed in the pair's colour, over exactly the steps where the
    pair is judged against them, and only for the quantity that needed them."""
    from common.compare import plots

    steps = {1: 1e-7, 2: 1e-5, 3: 1e-4}
    pair = {"kind": "backends", "a": "ddp@3#1", "b": "horovod-gloo@3#1", "rel_loss_diff": steps,
            "rel_weight_diff": {s: v / 10 for s, v in steps.items()}, "trains_differently_from": None,
            "branch_levels": {"loss": {2: 1e-6, 3: 1e-5}}, "gap": 1e-5, "bitwise_identical": False,
            "within_noise_floor": True, "noise_floor": 1e-5}
    floors = {3: {"runs": 3, "band": {q: {s: 1e-7 for s in steps} for q in ("loss", "weights")}}}
    fig = plots.parity_figure([pair], floors, margin=30.0)
    ax_loss, ax_weights, _ = fig.axes

    def judged(ax):
        return [line for line in ax.get_lines() if "rounding's branches" in line.get_label()]

    (line,) = judged(ax_loss)
    assert list(line.get_xdata()) == [2, 3] and list(line.get_ydata()) == pytest.approx([3e-5, 3e-4])
    (gap,) = [g for g in ax_loss.get_lines() if g.get_label() == "ddp@3#1 vs horovod-gloo@3#1"]
    assert line.get_color() == gap.get_color() and line.get_linestyle() == "--"
    assert judged(ax_weights) == []
