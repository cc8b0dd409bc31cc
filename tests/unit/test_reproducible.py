"""Whether a program reproduces itself, checked before anything is judged (common.compare.reproducible), and what
the verdicts say where it does not, or where two programs start apart (no process launched)."""

from __future__ import annotations

import torch

from common.compare import analysis, reproducible
from common.compare.results import SettingDifference
from .made_up import made_run, start, step

DISTURBED = {"perturb_ulp": 1, "perturb_pattern": 1}


def script(name: str) -> dict:
    return {"script": {"path": f"/folder/{name}"}}


def test_a_disturbed_run_of_a_script_that_starts_elsewhere_shows_it_does_not_reproduce_itself():
    base = made_run(config=script("train.py"), events=[start([1.0, 2.0], [1.0, 2.0])])
    disturbed = made_run(settings=DISTURBED, config=script("train.py"), events=[start([1.5, 2.0], [1.5, 2.0])])
    found = reproducible.check([base, disturbed])
    assert list(found) == [3]
    assert found[3].program == "train.py" and found[3].runs == ("ddp@3#1", "ddp+perturbed1@3#1")
    assert "start from initial weights 3.3e-01 apart" in found[3].evidence
    verdict = found[3].verdict
    assert verdict.startswith("cannot judge: train.py does not reproduce itself") and "seed torch" in verdict


def test_a_script_whose_first_batches_differ_between_runs_does_not_reproduce_itself():
    batches = [[[[64, 1], 3.0, 9.0]], [[[64, 1], 4.0, 16.0]]]
    shuffled = [batches[0], [[[64, 1], 5.0, 25.0]]]
    base = made_run(config=script("train.py"), events=[start([1.0]), step(1, 2.3, [1.0], inputs=batches)])
    disturbed = made_run(settings=DISTURBED, config=script("train.py"),
                         events=[start([1.0], [1.0000001]), step(1, 2.3, [1.0], inputs=shuffled)])
    (found,) = reproducible.check([base, disturbed]).values()
    assert found.evidence.startswith("rank 1's first batch differs")


def test_runs_moved_by_the_disturbance_alone_reproduce():
    # the probe's record before the disturbance is the same to the bit
    base = made_run(config=script("train.py"), events=[start([1.0, 2.0], [1.0, 2.0])])
    disturbed = made_run(settings=DISTURBED, config=script("train.py"), events=[start([1.0, 2.0], [1.0000001, 2.0])])
    # the loop records the start after its disturbance: within a few ulps of its base
    loop = made_run(events=[start(wnorm=[1.0, 2.0])])
    loop_disturbed = made_run(settings=DISTURBED, events=[start(wnorm=[1.0 + 2 ** -23, 2.0])])
    assert reproducible.check([base, disturbed]) == {} and reproducible.check([loop, loop_disturbed]) == {}
    far = made_run(settings=DISTURBED, events=[start(wnorm=[1.001, 2.0])])
    assert list(reproducible.check([loop, far])) == [3]


def test_repeats_must_start_alike():
    first = made_run(config=script("a.py"), events=[start([1.0])])
    again = made_run(config=script("a.py"), events=[start([1.2])], repeat=1)
    assert reproducible.check([first, again])[3].runs == ("ddp@3#1", "ddp@3#2")


def test_no_pair_is_judged_where_a_program_does_not_reproduce_itself():
    a = made_run(events=[start([1.0])], weights={"w": torch.ones(3)})
    b = made_run("horovod", controller="gloo", events=[start([1.0])], weights={"w": torch.ones(3) * 2})
    found = reproducible.Irreproducible("train.py", 3, ("ddp@3#1", "ddp+perturbed1@3#1"), "evidence")
    pair = analysis.parity(a, b, irreproducible=found)
    assert pair.verdict == found.verdict and pair.within_noise_floor is None
    assert pair.trains_differently_from is None and pair.cannot_judge == found.verdict


def test_two_programs_that_start_apart_train_differently_from_step_0_whatever_the_floor():
    events_a = [start([1.0, 2.0]), step(1, 2.3, [1.0, 2.0])]
    events_b = [start([1.1, 2.0]), step(1, 2.3, [1.1, 2.0])]
    a = made_run(events=events_a, weights={"w": torch.ones(3)})
    b = made_run("horovod", controller="gloo", events=events_b, weights={"w": torch.ones(3) * 1.1})
    pair = analysis.parity(a, b)  # no floor at all
    assert pair.trains_differently_from == 0 and pair.within_noise_floor is False
    assert pair.verdict.startswith("trains differently from the start (the initial weights 9.1e-02 apart")
    assert reproducible.start_gap(a, b) == pair.start_gap > 0


def test_an_optimizer_setting_that_differs_trains_differently_from_where_it_acts():
    """A weight decay buried under float16's rounding, or a momentum, is a difference by itself, as the learning rate
    is: the configured settings (the loop) or the recorded param groups (the probe) say so."""
    wnorm = [1.0, 2.0]
    events = [start(wnorm), step(1, 2.3, wnorm), step(2, 2.2, wnorm), step(3, 2.1, wnorm)]
    a = made_run(settings={"optimizer": "sgd", "momentum": 0.9, "weight_decay": 0.0}, events=events)
    b = made_run("horovod", controller="gloo", events=events, weights={"w": torch.ones(3) * 2},
                 settings={"optimizer": "sgd", "momentum": 0.9, "weight_decay": 5e-4})
    pair = analysis.parity(a, b)
    assert pair.setting_difference == SettingDifference(step=1, group=0, setting="weight_decay", a=0.0, b=5e-4,
                                                        acts=2)
    assert pair.trains_differently_from == 2 and "the optimizer's weight decay differs from step 1" in pair.verdict
    c = made_run("horovod", controller="gloo", events=events, weights={"w": torch.ones(3) * 2},
                 settings={"optimizer": "sgd", "momentum": 0.85, "weight_decay": 0.0})
    assert analysis.parity(a, c).trains_differently_from == 3  # a momentum first acts in the second update
    # a run of the probe: every param group's settings per step, how the step is computed left out
    grouped = [dict(e, groups=[{"lr": 0.1, "momentum": 0.9, "foreach": f}]) if e["event"] == "step" else e
               for e, f in zip(events, [None, True, False, True], strict=True)]
    d = made_run(events=grouped)
    e = made_run("horovod", controller="gloo", events=grouped)
    assert analysis.parity(d, e).setting_difference is None
