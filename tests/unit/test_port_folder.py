"""The port of a folder (python -m ddp_train.port DIR -o OUT), without launching: a team's codebase (tests/projects.py)
ported whole, the training followed across its modules, what is skipped, what one script's port says of the modules
it imports, and when DDP must look for parameters a step skipped."""

from __future__ import annotations

import ast
import json
import sys
import textwrap
from pathlib import Path

import pytest

from ddp_train.port.__main__ import main as port_main
from ddp_train.port.follow import skipping
from ddp_train.port.project import Resolver, read_folder
from ddp_train.port.report import from_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from projects import write_project  # noqa: E402


def imports_horovod(text: str) -> bool:
    for node in ast.walk(ast.parse(text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(n == "horovod" or n.startswith("horovod.") for n in names):
            return True
    return False


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    """The project with the folders a team's checkout has beside its code, ported to OUT with a JSON report."""
    root = write_project(tmp_path_factory.mktemp("proj") / "proj")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / ".venv" / "lib" / "horovod_user.py").write_text("import horovod.torch as hvd\n")
    (root / "runs" / "old").mkdir(parents=True)
    (root / "runs" / "old" / "metrics.jsonl").write_text("{}\n")
    out = root.parent / "proj_ddp"
    report = root.parent / "port.json"
    code = port_main([str(root), "-o", str(out), "--report-json", str(report)])
    return root, out, code, from_json(report.read_text()), json.loads(report.read_text())


def test_every_file_that_uses_horovod_is_ported_and_the_rest_copied(ported):
    root, out, code, report, _ = ported
    assert code == 0 and not report.unported
    assert report.files == ["train.py", "trainkit/data.py", "trainkit/engine.py", "trainkit/metrics.py"]
    for path in report.files:
        assert not imports_horovod((out / path).read_text()), path
    for same in ("trainkit/__init__.py", "trainkit/models.py", "data.json"):
        assert (out / same).read_bytes() == (root / same).read_bytes()
    assert {(s.path, s.why.split(" (")[0]) for s in report.skipped} == {
        (".git", "version control"), (".venv", "a virtual environment"), ("runs", "run output")}
    assert not (out / ".git").exists() and not (out / ".venv").exists() and not (out / "runs").exists()
    assert (root / "trainkit" / "engine.py").read_text().count("hvd.rank()") == 1  # the source is left as it was


def test_changes_are_reported_at_their_file_and_line(ported):
    _, _, _, report, raw = ported
    where = {(c.file, c.rule) for c in report.changes}
    assert ("trainkit/data.py", "hvd.size") in where and ("trainkit/metrics.py", "hvd.allreduce_") in where
    assert all("file" in c for c in raw["changes"])
    no_sync = [c for c in report.changes if c.rule == "backward_passes_per_step"]
    assert [(c.file, c.line) for c in no_sync] == [("trainkit/engine.py", 13)]
    assert "at train.py:" in no_sync[0].text  # the wrap it comes from
    # the loop is found in engine.py, so train.py's wrap does not say that no loop shows the last pass
    assert not any("no loop shows" in c.text for c in report.changes)


def test_the_loop_in_another_module_runs_its_other_passes_under_no_sync(ported):
    _, out, _, _, _ = ported
    engine = (out / "trainkit" / "engine.py").read_text()
    assert "with contextlib.nullcontext() if (i + 1) % accum_steps == 0 else model.no_sync():" in engine
    assert "import contextlib" in engine and "dist.get_rank() == 0" in engine


def test_a_model_whose_forward_skips_a_submodule_gets_find_unused_parameters_and_horovods_zeros(ported):
    _, out, _, report, _ = ported
    train = (out / "train.py").read_text()
    assert "model = DDP(model, forward_sync_buffers=False, find_unused_parameters=True)" in train
    assert "zero_missing_gradients(optimizer)" in train
    (change,) = [c for c in report.changes if c.rule == "parameters without a gradient"]
    assert change.file == "train.py" and "trainkit/models.py:17" in change.text and "self.aux" in change.text
    assert "walk of the autograd graph" in change.text  # its cost


def test_porting_the_port_changes_nothing(ported, tmp_path):
    _, out, _, _, _ = ported
    again = tmp_path / "again"
    assert port_main([str(out), "-o", str(again)]) == 0
    for path in ("train.py", "trainkit/engine.py", "trainkit/data.py"):
        assert (again / path).read_text() == (out / path).read_text()


def test_one_script_never_says_all_ported_while_its_modules_use_horovod(tmp_path, capsys):
    root = write_project(tmp_path / "proj")
    code = port_main([str(root / "train.py"), "-o", str(tmp_path / "train_ddp.py")])
    captured = capsys.readouterr()
    assert code == 1
    assert "3 left unported" in captured.out and "0 left unported" not in captured.out
    for module in ("trainkit/data.py", "trainkit/engine.py", "trainkit/metrics.py"):
        assert module in captured.out and module in captured.err
    assert f"python -m ddp_train.port {root} -o" in captured.err
    # what the script learns from its modules all the same: the loop is in engine.py
    assert "no loop shows" not in captured.out


def test_one_script_with_a_folder_as_output_ports_its_folder(tmp_path, capsys):
    root = write_project(tmp_path / "proj")
    assert port_main([str(root / "train.py"), "-o", str(tmp_path / "out") + "/"]) == 0
    assert not imports_horovod((tmp_path / "out" / "trainkit" / "metrics.py").read_text())
    assert capsys.readouterr().out.splitlines()[2].startswith("  train.py:")  # the script's changes first


def test_in_place_rewrites_the_files_where_they_stand(tmp_path):
    root = write_project(tmp_path / "proj")
    models = (root / "trainkit" / "models.py").read_text()
    assert port_main([str(root), "--in-place"]) == 0
    assert not imports_horovod((root / "trainkit" / "engine.py").read_text())
    assert (root / "trainkit" / "models.py").read_text() == models


def test_an_output_folder_that_holds_files_is_refused_in_one_line(tmp_path, capsys):
    root = write_project(tmp_path / "proj")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine\n")
    assert port_main([str(root), "-o", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exists and is not an empty folder" in err
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine\n"


def _skips(tmp_path: Path, files: dict, factory: str):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    folder = read_folder(tmp_path)
    return skipping(folder.file("train.py"), factory, Resolver(folder))


def test_skipping_is_found_through_factories_and_submodules_and_not_where_every_step_uses_all(tmp_path):
    head = '''
        import torch.nn as nn
        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.main, self.extra = nn.Linear(2, 2), nn.Linear(2, 2)
            def forward(self, x, extra=False):
                return self.main(x) + (self.extra(x) if extra else 0)
        class Plain(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)
            def forward(self, x):
                return self.fc(x)
        class Wrapper(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = Head()
            def forward(self, x):
                return self.head(x)
        def build():
            model = Wrapper()
            return model
        '''
    files = {"pkg/nets.py": head, "train.py": "from pkg import nets\nfrom pkg.nets import Plain\n"}
    found = _skips(tmp_path, files, "nets.build")
    assert found is not None and found.where.startswith("pkg/nets.py:") and "Head.forward calls self.extra" in \
        found.what
    assert _skips(tmp_path, files, "Plain") is None
    assert _skips(tmp_path, files, "torchvision.models.resnet18") is None


def test_a_function_of_another_module_reads_the_handed_models_own_attributes_through_module(tmp_path):
    files = {
        "train.py": '''
            import torch
            import horovod.torch as hvd
            from helpers import report_norm
            from helpers import loop as run_loop

            hvd.init()
            model = torch.nn.Linear(2, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                                 backward_passes_per_step=2)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            run_loop(net=model, opt=optimizer)
            report_norm(model)
            ''',
        "helpers.py": '''
            def loop(net, opt):
                for i in range(4):
                    for k in range(2):
                        net(torch.ones(1, 2)).sum().backward()
                    opt.step()

            def report_norm(model):
                net = model
                print(model.weight.norm(), model.train(), net.weight)
            '''}
    for name, text in files.items():
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_text(textwrap.dedent(text))
    assert port_main([str(tmp_path / "in"), "-o", str(tmp_path / "out")]) == 0
    helpers = (tmp_path / "out" / "helpers.py").read_text()
    # keywords and renamed parameters are followed; the inner range loop's last pass syncs
    assert "with contextlib.nullcontext() if k + 1 >= 2 else net.no_sync():" in helpers
    assert "print(model.module.weight.norm(), model.train(), net.weight)" in helpers
