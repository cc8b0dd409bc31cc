"""report.html in a real browser (headless Chromium): after make demo's comparison (conftest.demo), the page loads
every figure, logs no error, shows the whole summary on its first screen (1400 x 900), and each summary cell is a
word and a short reason that agrees with the verdict summary.json holds for that pair."""

from __future__ import annotations

import json

import pytest

from browser import FIRST_SCREEN, open_page
from common.compare.summary import from_step
from common.rundir.names import SUMMARY_FILE

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def demo_page(demo):
    out, _, summary = demo
    return out, summary, open_page(out / "report.html")


def test_every_figure_loads_and_nothing_is_logged_as_an_error(demo_page):
    out, summary, page = demo_page
    assert page.errors == []
    assert len(page.image_widths) >= 4 and all(width > 0 for width in page.image_widths), page.image_widths
    assert set(summary["plots"].values()) <= {p.name for p in out.glob("*.png")}


def test_the_whole_summary_is_on_the_first_screen(demo_page):
    _, summary, page = demo_page
    box = page.summary_box
    assert box is not None
    assert 0 <= box["top"] and box["bottom"] <= FIRST_SCREEN["height"] and box["right"] <= FIRST_SCREEN["width"], box
    # the speed, scaling and runs lines follow the table on that screen
    first_screen = page.text.split("Verdicts")[0]
    for line in ("speed", "scaling", "runs"):
        assert summary["summary"][line] in first_screen


def test_each_summary_cell_is_short_and_agrees_with_summary_json(demo_page):
    out, summary, page = demo_page
    header, *rows = page.summary_cells
    columns = summary["summary"]["columns"]
    assert header == ["world size", *columns]
    pairs = {(p["world_size"], f"{p['a'].split('@')[0]} vs {p['b'].split('@')[0]}"): p for p in summary["parity"]
             if p["kind"] != "repeat"}
    assert len(rows) == len(summary["summary"]["rows"]) >= 2
    for row, recorded in zip(rows, summary["summary"]["rows"], strict=True):
        world = recorded["world_size"]
        assert row[0] == str(world)
        for column, shown in zip(columns, row[1:], strict=True):
            if (world, column) not in pairs:
                assert shown == "–"
                continue
            pair, cell = pairs[world, column], recorded["cells"][column]
            assert shown == cell["text"] and len(shown) <= 200 and cell["verdict"] == pair["verdict"]
            # the word is the verdict's
            if pair["bitwise_identical"] or pair["within_noise_floor"] is True:
                assert cell["kind"] == "same", (cell, pair["verdict"])
            elif pair["within_noise_floor"] is False:
                assert cell["word"] == f"differs {from_step(pair['trains_differently_from'])}"
            elif pair["cannot_judge"]:
                assert cell["kind"] == "cannot judge"
    # report.md opens with the same summary, in the same order as the page
    markdown = (out / "report.md").read_text()
    assert markdown.index("## Summary") < markdown.index("## Verdicts") < markdown.index("## Learning curves")
    assert json.loads((out / SUMMARY_FILE).read_text())["summary"]["columns"] == columns
