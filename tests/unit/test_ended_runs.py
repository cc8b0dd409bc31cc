"""What the comparison says of the runs at a world size counts the runs that ended, and says how many did
(common.compare.ended): no launch."""

from __future__ import annotations

from common.compare.ended import Cell, floor_needed, unpaired
from .made_up import made_run


def test_a_floor_is_skipped_for_identical_weights_only_where_two_runs_ended():
    both = [Cell("ddp@2#1", 2, True, "abc"), Cell("horovod-gloo@2#1", 2, True, "abc")]
    assert floor_needed(2, both) == (False, "2 of the 2 runs at world size 2 ended, all with bitwise identical "
                                            "weights, so no noise floor is needed")
    one = [Cell("ddp@2#1", 2, True, "abc"), Cell("horovod-gloo@2#1", 2, False)]
    needed, why = floor_needed(2, one)
    assert not needed and why == ("only 1 of the 2 runs at world size 2 ended (horovod-gloo@2#1 failed), so no pair "
                                  "there needs a noise floor")
    assert "bitwise identical" not in why
    three = [*one, Cell("horovod-mpi@2#1", 2, True, "abc")]
    assert floor_needed(2, three)[1].startswith("2 of the 3 runs at world size 2 ended, all with bitwise identical")
    apart = [Cell("ddp@3#1", 3, True, "abc"), Cell("horovod-gloo@3#1", 3, True, "def"), *one]
    assert floor_needed(3, apart) == (True, "")


def test_a_world_size_where_fewer_than_two_runs_ended_says_so():
    runs = [made_run("ddp", 2), made_run("ddp", 3), made_run("horovod", 3, controller="gloo")]
    failures = [{"name": "horovod-gloo@2#1"}, {"name": "horovod-mpi@3#1"}, {"name": "ddp+perturbed1@3#1"}]
    assert unpaired(runs, failures) == [
        "At world size 2 only 1 of the 2 runs ended (horovod-gloo@2#1 failed): no pair there was compared."]
    assert unpaired(runs, []) == []
