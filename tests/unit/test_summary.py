"""The report's answer first (common.compare.summary) and its two renderings (common.compare.document): a cell per
pair and world size, a word and a short reason; speed and scaling lines that say what limits them (no process
launched)."""

from __future__ import annotations

from pathlib import Path

from common.compare import summary
from common.compare.document import Bullets, Figure, Paragraph, Section, Table, from_markdown, markdown, render_html
from common.compare.results import Cause, Departure, LrDifference, ParityResult


def pair(**fields) -> ParityResult:
    return ParityResult(**{"a": "ddp@3#1", "b": "horovod-gloo@3#1", "world_size": 3, **fields})


def test_a_cell_is_a_word_and_a_short_reason():
    assert summary.cell(pair(bitwise_identical=True, verdict="bitwise identical")).text == "same: bitwise identical"
    within = pair(within_noise_floor=True, largest_band_ratio=None, verdict="within the noise floor: ...")
    assert summary.cell(within).text == "same: within rounding"
    lr = pair(within_noise_floor=False, trains_differently_from=12, lr_difference=LrDifference(11, 0.05, 0.1),
              departure=Departure(13, "loss", 1e-3, 1e-7, 1e4), verdict="beyond the noise floor: ...")
    assert summary.cell(lr).text == "differs from step 12: learning rate x2 (0.05 vs 0.1)"
    caused = pair(within_noise_floor=False, trains_differently_from=0, start_gap=0.3,
                  cause=Cause(None, "initial weights", "the two scripts start from different weights", "g"))
    assert summary.cell(caused).text == "differs from the start: the two scripts start from different weights"
    cannot = pair(cannot_judge="cannot judge: train.py does not reproduce itself: evidence; fix: seed torch")
    assert summary.cell(cannot).text == "cannot judge: train.py does not reproduce itself"
    unknown = pair(gap=0.01, verdict="differs: parameters by 0.01 ...; noise floor unknown (--noise-floor off)")
    assert summary.cell(unknown).kind == "apart"
    long = pair(within_noise_floor=False, trains_differently_from=2,
                cause=Cause(2, "gradients", "x" * 300, "g"))
    assert len(summary.cell(long).text) <= summary.CELL_LIMIT
    # a long reason is cut at a word, never in the middle of one
    words = pair(within_noise_floor=False, trains_differently_from=1,
                 cause=Cause(1, "weights", "the port's rewrite at line 42 " * 12, "w"))
    text = summary.cell(words).text
    assert len(text) <= summary.CELL_LIMIT and text.endswith("…")
    assert text[:-1].split()[-1] in ("the", "port's", "rewrite", "at", "line", "42"), text


def test_the_table_has_a_row_per_world_size_and_a_column_per_pair():
    pairs = [pair(world_size=2, a="ddp@2#1", b="horovod-gloo@2#1", bitwise_identical=True),
             pair(within_noise_floor=True), pair(b="horovod-mpi@3#1", within_noise_floor=True),
             pair(kind="repeat", b="ddp@3#2", bitwise_identical=True)]
    columns, rows = summary.table(pairs)
    assert columns == ["ddp vs horovod-gloo", "ddp vs horovod-mpi"]
    assert [world for world, _ in rows] == [2, 3]
    assert rows[0][1][1] is None and rows[1][1][1] is not None


def test_speed_says_what_limits_it():
    throughput = {"ddp@2": {"median": 5000.0, "min": 4900.0, "max": 5100.0, "n": 2, "hosts": []},
                  "horovod-gloo@2": {"median": 4000.0, "min": 3900.0, "max": 4100.0, "n": 2, "hosts": []},
                  "horovod-gloo+predivide@2": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1, "hosts": []}}
    line = summary.speed_line(throughput, ["steps of 2 ms of compute: per-step overheads decide these speeds"])
    assert line == ("Speed: at 2 ranks ddp 5000, horovod-gloo 4000 (-20%) samples/s (beyond the spread across "
                    "repeats). Steps of 2 ms of compute: per-step overheads decide these speeds.")
    assert summary.scaling_line({"ddp": {1: 1.0, 2: 0.8}}, []) == \
        "Scaling efficiency (throughput(N) / N x throughput(1)): ddp 0.80 at 2."


def test_one_document_renders_as_markdown_and_as_one_html_page(tmp_path: Path):
    (tmp_path / "f.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    parts = [Section("Summary", [Table(["world size", "a vs b"], [["2", "same: bitwise identical"]],
                                       kinds=[["", "same"]], css_class="summary"), Paragraph("**Speed**: `x`")]),
             Section("Reference", [Bullets(["one"], ["why"]), Figure("f.png", "a figure")], folded=True)]
    md = markdown("Title", parts)
    assert md.startswith("# Title\n\n## Summary\n\n| world size | a vs b |\n|---|---|\n| 2 | same: bitwise identical |")
    assert "## Reference" in md and "![a figure](f.png)" in md and "  why" in md
    page = render_html("Title", parts, tmp_path)
    assert '<td class="same">same: bitwise identical</td>' in page and "<strong>Speed</strong>: <code>x</code>" in page
    assert "<details><summary>Reference</summary>" in page and 'src="data:image/png;base64,' in page
    assert page.index("Summary") < page.index("Reference")
    # the benchmark section comes as markdown: read back into sections
    (back,) = from_markdown(["## Benchmarks", "", "| a | b |", "|---|---|", "| 1 | 2 |", "![fig](f.png)"])
    assert back.title == "Benchmarks" and isinstance(back.blocks[0], Table) and back.blocks[0].rows == [["1", "2"]]


def test_the_runs_line_counts_and_names_the_runs_that_failed():
    from .made_up import made_run

    runs = [made_run("ddp", 2), made_run("horovod", 2, controller="gloo")]
    line = summary.runs_line(runs, ["horovod-mpi@2#1", "horovod-mpi@3#1"])
    assert line.endswith("; 2 runs; 2 failed: horovod-mpi@2#1, horovod-mpi@3#1."), line
    assert summary.runs_line(runs).endswith("; 2 runs."), summary.runs_line(runs)
    assert summary.runs_line([], ["ddp@2#1"]) == "No run to describe: 1 failed: ddp@2#1."


def test_a_difference_the_port_announced_is_its_own_kind_of_cell():
    announced = pair(within_noise_floor=False, trains_differently_from=1,
                     cause=Cause(1, "weights", "broadcast_optimizer_state's zero step", "w"),
                     explained_by="the port's rewrite at line 8 (hvd.broadcast_optimizer_state); to train the same, "
                                  "port with --zero-step keep")
    cell = summary.cell(announced)
    assert cell.kind == summary.ANNOUNCED and cell.word == "differs from step 1"
    assert "--zero-step keep" in cell.reason
    plain = pair(within_noise_floor=False, trains_differently_from=1, cause=Cause(1, "weights", "lr", "w"))
    assert summary.cell(plain).kind == summary.DIFFERS
