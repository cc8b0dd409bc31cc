"""Verdicts judged where a divergence starts, against a noise floor of several disturbed runs: the default
comparison at 3 ranks (make demo's training) is never "beyond" it; a 20% higher learning rate under Adam is beyond it
from step 2, and runs with different settings are never called repeats; a 10% higher learning rate and fp16
compression are beyond it; the numbers a verdict gives are what the run directories hold, computed here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launched import compare_in_process, read_run
from settings import DEMO
from test_compare import assert_real_image, compare
from common.rundir.names import SUMMARY_FILE

# The first test's setup can be make demo's comparison, minutes while another worker runs too.
pytestmark = pytest.mark.timeout(900)

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
    weights = {s: max(relative(x, y) for x, y in zip(fa[s], fb[s], strict=True)) for s in fa if s in fb}
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
    assert f"**{pair['verdict']}**" in report and "## The noise floor" in report
    assert_real_image(out / "parity.png")


@pytest.fixture(scope="module")
def adam_lr(runs, tmp_path_factory):
    """Two DDP runs at 2 ranks under Adam, lr 0.001 and 0.0012, compared with --runs --force (the floor made by
    rerunning the first, in two disturbances: a pair beyond a floor is beyond a wider one too): (the two runs, the
    output folder, what the comparison printed, its summary)."""
    a, b = runs("torchrun", 2, ADAM + ["--lr", "0.001"]), runs("torchrun", 2, ADAM + ["--lr", "0.0012"])
    out = tmp_path_factory.mktemp("adam-lr")
    result = compare("--runs", a.dir, b.dir, "--out", out, "--force", "--floor-runs", "2", timeout=600)
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
    # The floor was made here from the first run's recorded settings, in as many patterns as --floor-runs asks.
    assert "rerunning ddp[lr=0.001]@2#1's settings here with --perturb-ulp 1" in output
    made = sorted(p for p in (out / "runs").iterdir() if p.is_dir())
    assert [read_run(p)["config"]["config"]["perturb_pattern"] for p in made] == [1, 2]
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
    """--compression fp16 on both backends at 3 ranks, Horovod with Gloo and MPI: the summary."""
    out = tmp_path_factory.mktemp("fp16-both")
    result = compare("--np", "3", "--compression", "fp16", "--epochs", "1", "--repeats", "1", "--explain", "none",
                     "--floor-runs", "2", *DEMO, "--out", out, timeout=600)
    assert result.returncode == 0, result.output[-3000:]
    return json.loads((out / SUMMARY_FILE).read_text())


def test_fp16_compression_on_both_backends_is_judged_against_float16s_rounding(fp16_both):
    """Both send float16 gradients, grouped otherwise (DDP divides before compressing, Horovod after the sum): apart
    from the first update, Gloo against MPI too, and never beyond a floor that rounds there."""
    pairs = [p for p in fp16_both["parity"] if p["kind"] == "backends"]
    assert {(p["a"], p["b"]) for p in pairs} == {("ddp@3#1", "horovod-gloo@3#1"), ("ddp@3#1", "horovod-mpi@3#1"),
                                                  ("horovod-gloo@3#1", "horovod-mpi@3#1")}
    for pair in pairs:
        assert pair["within_noise_floor"] is not False and pair["trains_differently_from"] is None, pair["verdict"]
    # the floor's disturbed runs moved their gradients by float16's unit
    assert fp16_both["noise_floors"]["3"]["band"]["weights"]["2"] > 1e-5


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
