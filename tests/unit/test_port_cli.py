"""`python -m ddp_train.port` as a command (its main() called here, no process launched): where the port and the
report go, the JSON report, the exit codes, the one-line refusals; and the worked example's port."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from ddp_train.port.__main__ import default_output, main
from ddp_train.port.report import from_json

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "migrating" / "train_horovod.py"
SCRIPT = """import torch
import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size(), weight_decay=5e-4)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
"""


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train_horovod.py"
    path.write_text(SCRIPT)
    return path


def test_the_port_goes_beside_the_script_and_the_report_to_stdout(script, capsys):
    assert main([str(script)]) == 0
    port = script.with_name("train_ddp.py").read_text()
    assert "import horovod" not in port and "model = DDP(model, forward_sync_buffers=False)" in port
    out = capsys.readouterr().out
    assert f"{script} -> {script.with_name('train_ddp.py')}:" in out
    assert "! line 8: [hvd.broadcast_optimizer_state]" in out
    assert "changes training: the zero optimizer step under weight decay 5e-4 is not reproduced" in out


def test_the_json_report_reads_back_into_the_same_report(script, tmp_path, capsys):
    report = tmp_path / "r.json"
    assert main([str(script), "-o", str(tmp_path / "out.py"), "--report-json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["exit_code"] == 0 and data["changes_training"] is True and data["zero_step"] == "dropped"
    assert data["source"] == str(script) and data["output"] == str(tmp_path / "out.py") and data["unported"] == []
    zero = next(c for c in data["changes"] if c["rule"] == "hvd.broadcast_optimizer_state")
    assert zero == {"line": 8, "rule": "hvd.broadcast_optimizer_state", "text": zero["text"],
                    "changes_training": True, "effect": zero["effect"], "cause": "optimizer steps before training",
                    "file": None}
    back = from_json(report.read_text())
    assert back.changes[0].line == data["changes"][0]["line"] and back.exit_code == 0


def test_diff_prints_the_change_and_writes_nothing(script, capsys):
    assert main([str(script), "--diff"]) == 0
    captured = capsys.readouterr()
    assert "-import horovod.torch as hvd\n+import torch.distributed as dist\n" in captured.out
    assert "(not written)" in captured.err and not script.with_name("train_ddp.py").exists()


def test_the_port_on_stdout_sends_the_report_to_stderr(script, capsys):
    assert main([str(script), "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("import torch\nimport torch.distributed as dist\n") and "->" in captured.err


def test_what_is_left_unported_exits_1_with_the_port_written(tmp_path, capsys):
    script = tmp_path / "t.py"
    script.write_text("import horovod.torch as hvd\nhvd.init()\nx = hvd.alltoall(y)\n")
    assert main([str(script)]) == 1
    assert "# port: not ported: hvd.alltoall" in (tmp_path / "t_ddp.py").read_text()
    assert "? line 3: not ported: x = hvd.alltoall(y)" in capsys.readouterr().out


@pytest.mark.parametrize("make, args, says", [
    (None, ["nowhere.py"], "nowhere.py: cannot be read (No such file or directory)"),
    ("import horovod.torch as hvd\nif x\n", ["bad.py"], "bad.py:2:5: not Python the port can read"),
    (SCRIPT, ["ok.py", "-o", "no/such/dir/out.py"], "-o no/such/dir/out.py: cannot be written"),
])
def test_bad_input_is_refused_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys, make, args, says):
    monkeypatch.chdir(tmp_path)
    if make is not None:
        Path(args[0]).write_text(make)
    assert main(args) == 2
    _one_line(capsys, says)


@pytest.mark.parametrize("args, says", [(["--zero-step", "maybe"], "argument --zero-step: invalid choice"),
                                        (["--dif"], "unrecognized arguments: --dif"),  # no abbreviation of --diff
                                        (["--zero", "keep"], "unrecognized arguments: --zero keep")])
def test_a_bad_option_is_refused_in_one_line_with_exit_2(capsys, args, says):
    with pytest.raises(SystemExit) as refused:
        main(["x.py", *args])
    assert refused.value.code == 2
    _one_line(capsys, says)


def _one_line(capsys, says: str) -> None:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m ddp_train.port: error: ") and says in lines[0], lines


@pytest.mark.parametrize("name, expected", [("train_horovod.py", "train_ddp.py"), ("hvd_mnist.py", "ddp_mnist.py"),
                                            ("train.py", "train_ddp.py")])
def test_the_default_output_name(name, expected):
    assert default_output(Path("/x") / name) == Path("/x") / expected


def test_the_worked_example_ports_whole_without_a_change_to_training(tmp_path, capsys):
    out = tmp_path / "train_ddp.py"
    assert main([str(EXAMPLE), "-o", str(out), "--report-json", str(tmp_path / "r.json")]) == 0
    report = from_json((tmp_path / "r.json").read_text())
    port = out.read_text()
    assert not report.unported and not report.changes_training and report.zero_step == "dropped"
    tree = ast.parse(port)
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + \
        [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m and m.split(".")[0] == "horovod"], imported
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "hvd"]
    for line in ("    model = DDP(model, forward_sync_buffers=False)\n", "        avg_tensor = all_averaged(tensor)\n",
                 "    rank, size, local_rank = dist.get_rank(), dist.get_world_size(), "
                 "int(os.environ['LOCAL_RANK'])\n"):
        assert line in port
    # every line of the example without Horovod is in the port as it was
    kept = [line for line in EXAMPLE.read_text().splitlines() if "hvd" not in line and "horovod" not in line]
    assert all(line in port.splitlines() for line in kept if line.strip() and not line.lstrip().startswith(
        ("# Horovod: broadcast", "# Horovod: wrap", "named_parameters", "op=hvd")))
