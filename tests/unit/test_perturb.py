"""The noise floor's disturbances (common.inputs.perturb): the gradients of a run that exchanges them at float16 move
one float16 unit each, the same way on every rank, anew at every step (no process launched)."""

from __future__ import annotations

import torch

from common.inputs.perturb import GradientDisturbance, gradient_disturbance


def parameter(grad: torch.Tensor) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.zeros_like(grad))
    p.grad = grad.clone()
    return p


def test_each_nonzero_gradient_moves_one_unit_of_float16():
    grad = torch.cat([torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 1e-3, torch.zeros(5)])
    p = parameter(grad)
    GradientDisturbance("float16", 3)([p], step=1)
    moved = p.grad
    assert torch.equal(moved[-5:], torch.zeros(5))  # zeros stay
    # one float16 unit at each element's magnitude: ldexp(1, exponent - 11), float16's subnormals below 2**-14
    _, exponent = torch.frexp(grad[:-5])
    unit = torch.ldexp(torch.ones(1000), torch.clamp(exponent - 11, min=-24))
    assert torch.equal((moved[:-5] - grad[:-5]).abs(), unit)
    up = (moved[:-5] > grad[:-5]).float().mean()
    assert 0.4 < up < 0.6  # up or down, drawn


def test_the_draw_is_the_same_on_every_rank_and_new_at_every_step():
    grad = torch.randn(500, generator=torch.Generator().manual_seed(1))
    one, other, later = parameter(grad), parameter(grad), parameter(grad)
    GradientDisturbance("float16", 2)([one], step=4)
    GradientDisturbance("float16", 2)([other], step=4)
    GradientDisturbance("float16", 2)([later], step=5)
    assert torch.equal(one.grad, other.grad) and not torch.equal(one.grad, later.grad)


def test_only_a_disturbed_run_below_float32_disturbs_its_gradients():
    assert gradient_disturbance(1, 1, "float16") == GradientDisturbance("float16", 1)
    assert gradient_disturbance(0, 1, "float16") is None
    assert gradient_disturbance(1, 1, "float32") is None and gradient_disturbance(1, 1, None) is None
