"""How the port reads its sources: each file parsed once, by LibCST, and only where the port needs it (a file
whose text cannot import Horovod and that no ported file follows into is not parsed); a file it cannot parse
refused in one line with Python's own account of where; the imports read in the order Python's ast.walk meets
them; the survey's quote style and lines read from the LibCST tree."""

from __future__ import annotations

import ast
import sys
import textwrap
from collections import Counter
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import PositionProvider

import ddp_train.port
from ddp_train.port import PortError, port
from ddp_train.port.folder import port_folder
from ddp_train.port.names import horovod_names, survey
from ddp_train.port.project import HOROVOD_IMPORT, SourceFile
from ddp_train.port.walk import imports

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from projects import write_project  # noqa: E402


def test_each_file_of_a_folder_is_parsed_once_and_only_where_the_port_reads_it(tmp_path, monkeypatch):
    root = write_project(tmp_path / "proj")
    (root / "notes.py").write_text("# written for horovod once; no import of it here\nx = 1\n")
    (root / "broken_notes.py").write_text("# horovod, but not Python:\nif x\n")
    (root / "unused.py").write_text("import os\n")
    parsed: Counter = Counter()
    parse = cst.parse_module

    def counting(text, *args, **kwargs):
        parsed[text] += 1
        return parse(text, *args, **kwargs)

    monkeypatch.setattr(cst, "parse_module", counting)
    done = port_folder(root)
    texts = {f.path: f.text for f in done.folder.files}
    assert max(parsed.values()) == 1
    # the files that import Horovod, and models.py, which train.py's model is followed into (for the class of
    # its forward); neither the files that only mention Horovod nor those no ported file reads into
    assert {path for path, text in texts.items() if parsed[text]} == {
        "train.py", "trainkit/data.py", "trainkit/engine.py", "trainkit/metrics.py", "trainkit/models.py"}
    assert not done.report.unported  # broken_notes.py cannot import Horovod: not parsed, not reported


def test_no_module_of_the_port_parses_with_pythons_ast():
    package = Path(ddp_train.port.__file__).parent
    for path in package.glob("*.py"):
        module = cst.parse_module(path.read_text())
        names = [alias.evaluated_name for node in imports(module) if isinstance(node, cst.Import)
                 for alias in node.names]
        names += [cst.Module([]).code_for_node(node.module) for node in imports(module)
                  if isinstance(node, cst.ImportFrom) and node.module is not None]
        assert "ast" not in names, path.name


@pytest.mark.parametrize("text", [
    "import horovod", "import os, horovod.torch as hvd", "import os,\\\n    horovod", "from horovod.torch import x",
    "from \\\n horovod import x", "if 1:\n    import horovod", "x = 1; import horovod.torch", "import\thorovod",
])
def test_every_way_to_write_an_import_of_horovod_has_the_text_that_gets_a_file_parsed(text):
    assert HOROVOD_IMPORT.search(text) and SourceFile("t.py", "t", text).uses_horovod


def test_a_folder_file_that_imports_horovod_and_cannot_be_read_is_named_in_one_line_and_copied(tmp_path):
    (tmp_path / "bad.py").write_text("import horovod.torch as hvd\n\nif x\n")
    (tmp_path / "latin.py").write_bytes(b"import horovod.torch as hvd\nname = '\xe9'\n")
    done = port_folder(tmp_path)
    reasons = {u.file: u.reason for u in done.report.unported}
    assert reasons["bad.py"].startswith("bad.py:3:5: not Python the port can read (expected ':')")
    assert reasons["latin.py"].startswith("latin.py:2:9: not Python the port can read (a byte that is not UTF-8)")
    assert all("\n" not in reason and "copied as it is" in reason for reason in reasons.values())


@pytest.mark.parametrize("source, where", [
    ("import horovod.torch as hvd\nx = [1, 2\ny = 3\n", "2:5: ('[' was never closed)"),  # LibCST's: 3:2
    ("import horovod.torch as hvd\nx = 'abc\n", "2:5: (unterminated string"),
    ("import torch\n  y = 2\n", "2:2: (unexpected indent)"),
])
def test_a_syntax_error_is_told_where_python_tells_it(source, where):
    with pytest.raises(PortError) as refused:
        port(source, "train.py", "out.py")
    message = str(refused.value)
    line_column, what = where.split(" ", 1)
    assert message.startswith(f"train.py:{line_column} not Python the port can read {what}") and "\n" not in message


def test_the_imports_are_read_in_the_order_ast_walk_meets_them():
    source = textwrap.dedent("""\
        import a
        def f():
            import b
            try:
                import c
            except ImportError:
                import d
            else:
                import e
            finally:
                import f
        if x:
            import g
        elif y:
            import h
        else:
            import i
        match z:
            case 1:
                import j
        class K:
            import k; import l
        import m
        """)
    expected = [n.names[0].name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import)]
    found = [node.names[0].evaluated_name for node in imports(cst.parse_module(source))]
    assert found == expected and len(found) == 13


def test_a_name_imported_twice_is_the_import_met_last():
    module = cst.parse_module("def f():\n    import horovod.tensorflow as hvd\nimport horovod.torch as hvd\n")
    assert horovod_names(module).aliases == {"hvd": "horovod.tensorflow"}


def test_the_survey_reads_the_quote_style_and_the_lines_names_are_on_from_the_libcst_tree():
    source = textwrap.dedent("""\
        x = 'a' + 'b' + "c"
        y = f"{'d'}" "e"
        model = (net
                 .module)
        def step(model=None):
            model.load_state_dict(state)
            return "f" f"{g=}" 'h'
        """)
    module = cst.parse_module(source)
    positions = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    found = survey(module, positions, {"model", "net", "state"})
    # 'a', 'b' and 'd' against "c" and "f" f"{g=}" 'h', two strings to Python (a run of text before each
    # replacement field and one after the last, all at the first part's quote): a tie, written with "
    assert found.quote == '"' and found.loads_state == {"model"}
    assert found.lines == {"model": {3, 6}, "net": {3, 4}, "state": {6}}
