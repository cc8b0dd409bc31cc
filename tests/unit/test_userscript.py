"""A user's own script run as python runs it from inside one of the project's programs (common.launch.userscript):
its own `common` module found first, the project's packages back afterwards (no process launched)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import common
from common.launch import userscript


@pytest.fixture
def clean_sys(monkeypatch):
    """sys.argv and sys.path as they were after the test."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.mark.parametrize("layout", ["module", "package"])
def test_the_scripts_own_common_is_found_and_the_projects_comes_back(tmp_path: Path, clean_sys, layout):
    if layout == "module":
        (tmp_path / "common.py").write_text("WHOSE = 'the user'\n")
    else:
        (tmp_path / "common").mkdir()
        (tmp_path / "common" / "__init__.py").write_text("WHOSE = 'the user'\n")
    (tmp_path / "train.py").write_text(
        "import sys\nimport common\nfrom common import WHOSE\n"
        "open(sys.argv[1], 'w').write(WHOSE + ' ' + __name__ + ' ' + ' '.join(sys.argv[1:]))\n")
    out = tmp_path / "seen.txt"
    userscript.run(userscript.UserCode(str(tmp_path / "train.py"), (str(out), "--epochs", "2")))
    assert out.read_text() == f"the user __main__ {out} --epochs 2"
    assert sys.modules["common"] is common and "WHOSE" not in vars(common)  # the project's package is back
    assert sys.path[0] == str(tmp_path)  # the script's folder first, as python puts it


def test_a_module_runs_as_python_dash_m_runs_it(tmp_path: Path, clean_sys, monkeypatch):
    (tmp_path / "mytool.py").write_text("import sys\nopen('ran.txt', 'w').write(__name__ + ' ' + sys.argv[1])\n")
    monkeypatch.chdir(tmp_path)
    code = userscript.parse_target(["-m", "mytool", "value"])
    assert code == userscript.UserCode("mytool", ("value",), module=True)
    userscript.run(code)
    assert (tmp_path / "ran.txt").read_text() == "__main__ value"


def test_what_cannot_run_is_said_in_one_line(tmp_path: Path):
    assert "no such file" in userscript.check(userscript.UserCode(str(tmp_path / "missing.py")))
    with pytest.raises(ValueError, match="no script given"):
        userscript.parse_target([])
    with pytest.raises(ValueError, match="-m needs a module name"):
        userscript.parse_target(["-m"])


def test_the_safe_path_variables_reach_every_rank_and_leave_before_the_script(monkeypatch):
    env = userscript.safe_path_env({})
    # Only the two: Open MPI refuses a mca_base_env_list beside the -x that horovodrun passes every variable with
    assert env == {"PYTHONSAFEPATH": "1", userscript.SAFE_PATH_MARK: "1"}
    monkeypatch.setenv("PYTHONSAFEPATH", "1")
    monkeypatch.setenv(userscript.SAFE_PATH_MARK, "1")
    userscript.forget_safe_path()
    assert "PYTHONSAFEPATH" not in os.environ and userscript.SAFE_PATH_MARK not in os.environ
    monkeypatch.setenv("PYTHONSAFEPATH", "1")  # the user's own stays
    userscript.forget_safe_path()
    assert os.environ["PYTHONSAFEPATH"] == "1"
