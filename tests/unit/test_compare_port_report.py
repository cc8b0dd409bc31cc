"""The port's report as --port reads it (common.compare.port): each change at its file and line, and a report of one
script, without files, read too; no launch."""

from __future__ import annotations

from pathlib import Path

from common.compare import port
from common.compare.document import Table, markdown

REPORT = {"source": "/u", "output": "/o/port", "zero_step": "dropped", "exit_code": 1,
          "changes": [{"line": 87, "rule": "hvd.broadcast_optimizer_state", "text": "removed", "changes_training": True,
                       "effect": "Adam's step count", "cause": "optimizer steps before training", "file": "train.py"},
                      {"line": 3, "rule": "hvd.rank", "text": "dist.get_rank()", "file": "mypkg/loop.py"}],
          "unported": [{"line": 9, "code": "hvd.Adasum", "reason": "no DDP equivalent", "file": "mypkg/loop.py"}],
          "files": ["train.py", "mypkg/loop.py"], "skipped": [{"path": ".git", "why": "version control"}]}


def test_the_port_section_shows_each_change_at_file_and_line():
    ported = port.read_report(REPORT, Path("/u"), Path("/o/port"), Path("/u/train.py"))
    assert ported.script_port == "/o/port/train.py" and ported.files == ["train.py", "mypkg/loop.py"]
    section = port.section(ported)
    text = markdown("report", [section])
    assert "train.py:87 (hvd.broadcast_optimizer_state): Adam's step count" in text
    assert "mypkg/loop.py:9: `hvd.Adasum`: no DDP equivalent" in text and "`.git` (version control)" in text
    table = next(block for block in section.blocks if isinstance(block, Table))
    assert [row[0] for row in table.rows] == ["train.py:87", "mypkg/loop.py:3"]
    assert "| mypkg/loop.py:3 | hvd.rank |" in text


def test_a_report_of_one_script_without_files_is_read_too():
    old = {**REPORT, "changes": [{k: v for k, v in c.items() if k != "file"} for c in REPORT["changes"]],
           "unported": [{k: v for k, v in u.items() if k != "file"} for u in REPORT["unported"]]}
    del old["files"], old["skipped"]
    ported = port.read_report(old, Path("/u"), Path("/o/port"), Path("/u/train.py"))
    assert [r.file for r in ported.rewrites] == [None, None] and ported.files == [] and ported.skipped == []
    text = markdown("report", [port.section(ported)])
    assert "train.py:87 (hvd.broadcast_optimizer_state)" in text and "train.py:9: `hvd.Adasum`" in text
