"""Why two scripts part, read from made-up probe records (common.compare.causes): a factor is named only where every
gradient is scaled by it, never a factor of 1; gradients apart at float16's rounding are named as that."""

from __future__ import annotations

from typing import List, Optional

from common.compare import causes
from .made_up import made_run, start


def script_run(backend: str, gnorm: List[float], precision: Optional[str] = None, controller: Optional[str] = None):
    config = {"script": {"path": f"/folder/{backend}.py"}, "gradient_precision": precision}
    config_backend = {"backend": {"name": backend, "controller": controller, "script": True}}
    run = made_run(backend, 2, controller=controller, config=config,
                   events=[start([1.0, 2.0]), {"event": "step", "step": 1, "loss": 2.0, "wnorm": [1.0, 2.0],
                                               "gnorm": gnorm, "groups": [{"lr": 0.1}], "state": {},
                                               "ranks": [{"inputs": [[[8], 1.0, 1.0]]}] * 2}])
    run.config["backend"] = config_backend["backend"]
    return run


def cause(a, b) -> dict:
    found = causes.explain(a, b, 2)
    assert found is not None
    return found


def test_gradients_summed_over_the_ranks_are_named_as_the_world_size():
    found = cause(script_run("ddp", [2.0, 4.0]), script_run("horovod", [1.0, 2.0], controller="gloo"))
    assert "is 2x the other's" in found.text and "summed over the ranks" in found.text


def test_a_common_factor_other_than_the_world_size_is_a_scale():
    found = cause(script_run("ddp", [1.5, 3.0]), script_run("horovod", [1.0, 2.0], controller="gloo"))
    assert "the same factor, 1.5" in found.text


def test_gradients_apart_at_float16s_rounding_are_never_a_factor_of_1():
    a = script_run("ddp", [1.0003, 2.0004], precision="float16")
    b = script_run("horovod", [1.0, 2.0], precision="float16", controller="gloo")
    found = cause(a, b)
    assert "factor" not in found.text
    assert found.text.startswith("the gradients differ at float16's rounding from step 1")
    assert "another grouping" in found.text
    # one side compressed, the other not: said so
    found = cause(script_run("ddp", [1.0003, 2.0004]), b)
    assert "sends its gradients as float16 and the other does not" in found.text


def test_gradients_apart_by_more_than_rounding_at_float32_are_another_loss_or_reduction():
    found = cause(script_run("ddp", [1.05, 2.0]), script_run("horovod", [1.0, 2.0], controller="gloo"))
    assert "factor" not in found.text and "another loss, model or reduction" in found.text
