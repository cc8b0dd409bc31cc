"""The verdict rules on made-up trajectories (common.compare.trajectory, branches, plots) and the disturbances of the
noise floor (common.inputs.perturb): a same-training branch that starts before every disturbed run is judged from its
start and within, a late jump beyond where it jumps; the disturbance patterns (no process launched)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pytest
import torch

from common.compare.results import ParityResult


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
        for (name, param), away in zip(model.named_parameters(), ways, strict=True):
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
    return judged, departure and replace(departure, branch=branches.branch_of(departure, judged))


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
    assert departure is not None and departure.branch == 25 and departure.step > 25
    assert departure.ratio > 30


def test_a_real_difference_that_acts_late_is_beyond_the_floor_where_it_jumps():
    """A change that acts at step 60 (a schedule, an augmentation from the second epoch) after the pair differed by
    rounding does not grow from rounding's size: it jumps, beyond what the floor's branches start from."""
    floor_runs = [_trajectory(120, branch=90), _trajectory(120), _trajectory(120)]
    _, departure = _judge(_trajectory(120, branch=60, jump=5e-3), floor_runs)
    assert departure.step == 60 and departure.branch == 60 and departure.ratio == pytest.approx(500.0)
    # A difference large from the pair's first differing step is judged against the band there: no branch excuses it.
    early = _trajectory(120)
    early["loss"][2] = 1e-5
    _, departure = _judge(early, floor_runs)
    assert departure.step == 2 and departure.branch is None
    assert departure.ratio == pytest.approx(1e-5 / 2 ** -23)
    # With no disturbed run that branches, the band is all there is.
    flat = [_trajectory(120), _trajectory(120)]
    _, departure = _judge(_trajectory(120, branch=25), flat)
    assert departure.step == 25 and departure.branch is None


def test_parity_figure_draws_the_level_a_branching_pair_is_judged_against():
    """parity.png: `margin` times the floor's branches, dashed in the pair's colour, over exactly the steps where the
    pair is judged against them, and only for the quantity that needed them."""
    from common.compare import plots

    steps = {1: 1e-7, 2: 1e-5, 3: 1e-4}
    pair = ParityResult("ddp@3#1", "horovod-gloo@3#1", 3, rel_loss_diff=steps,
                        rel_weight_diff={s: v / 10 for s, v in steps.items()},
                        branch_levels={"loss": {2: 1e-6, 3: 1e-5}}, gap=1e-5, within_noise_floor=True,
                        noise_floor=1e-5)
    floors = {3: {"runs": 3, "band": {q: {s: 1e-7 for s in steps} for q in ("loss", "weights")}}}
    fig = plots.parity_figure([pair], floors, margin=30.0)
    ax_loss, ax_weights = fig.axes[0], fig.axes[1]  # one column: the loss above the weights

    def judged(ax):
        return [line for line in ax.get_lines() if "rounding's branches" in line.get_label()]

    (line,) = judged(ax_loss)
    assert list(line.get_xdata()) == [2, 3] and list(line.get_ydata()) == pytest.approx([3e-5, 3e-4])
    gap = next(g for g in ax_loss.get_lines() if g.get_linestyle() == "-")  # the pair's own gaps
    assert line.get_color() == gap.get_color() and line.get_linestyle() == "--"
    assert judged(ax_weights) == []
