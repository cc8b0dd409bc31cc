"""Each bad factory of a user's (tests/user_modules.py) is refused by open_inputs with the one line a rank prints
(common.trainer passes it to fail_usage); run in this process from the user's folder, as a rank imports from its
working directory. test_plugins launches the first and the last refusal under torchrun and horovodrun."""

from __future__ import annotations

import sys

import pytest

from common.config import parse_config
from common.errors import UsageError
from common.inputs.opening import open_inputs
from user_modules import BAD_FACTORIES, write_modules

USERS = ("tokens", "transformer", "bad", "broken", "nosuch_module")


@pytest.fixture
def users_folder(tmp_path, monkeypatch):
    """The user's modules in the working directory; sys.path and the imported modules as they were after."""
    monkeypatch.chdir(write_modules(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in USERS:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("case", list(BAD_FACTORIES))
def test_a_bad_factory_is_refused_in_one_line_naming_the_problem(users_folder, case):
    args, expected = BAD_FACTORIES[case]
    config = parse_config([*args, "--threads", "1", "--run-dir", str(users_folder / "run")], "ddp_train", "test")
    with pytest.raises((UsageError, ValueError, RuntimeError)) as refused:
        open_inputs(config)
    line = str(refused.value)
    assert expected in line and "\n" not in line, line
    assert not (users_folder / "run").exists()
