"""The docs: docs/training.md's option table is the one the code declares, README.md stays short, every
relative link resolves, and every training flag docs/training.md names exists. Reads files only: no launch."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Set

import pytest

from common.config import build_parser, options_markdown

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
TRAINING = DOCS / "training.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"
README_MAX_LINES = 200

#: flags of other programs that docs/training.md names in its prose: launchers and Open MPI
OTHER_PROGRAMS = {"--rdzv-backend", "--nproc-per-node", "--standalone", "--gloo", "--mpi", "--mpi-args",
                  "--allow-run-as-root", "--oversubscribe", "--mca", "--cycle-time-ms", "--tee"}

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def training_parts():
    """docs/training.md as (before the table, the table's text between the markers, after it)."""
    text = TRAINING.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and text.index(BEGIN) < text.index(END), \
        f"docs/training.md needs one {BEGIN} and one {END} line around the option table"
    before, rest = text.split(BEGIN)
    table, after = rest.split(END)
    return before, table, after


def training_flags() -> Set[str]:
    """Every option string of the training parser (both entry points use it unchanged)."""
    parser = build_parser("train", "docs")
    return {flag for action in parser._actions for flag in action.option_strings}


def test_option_table_is_generated_from_the_code():
    _, table, _ = training_parts()
    assert table == "\n" + options_markdown(), (
        "the option table of docs/training.md is not what common/config.py declares: run "
        "`python -m common.config` and paste its output between the markers, each marker on its own line")


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): it is the entrance; move detail to docs/")


def links(page: Path) -> List[str]:
    """The link targets of a markdown page, code blocks and code spans left out."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_relative_links_point_to_files_that_exist(page):
    broken = []
    for target in links(page):
        if SCHEME.match(target) or target.startswith("#"):
            continue  # a web address, or an anchor of this page
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{relative(page)} links to files that do not exist: {', '.join(broken)}"


def test_readme_links_every_docs_page():
    linked = {(README.parent / t.split("#", 1)[0]).resolve() for t in links(README) if not SCHEME.match(t)}
    missing = [relative(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md's 'Read more' does not link {', '.join(missing)}"


def test_flags_named_in_training_docs_are_training_options():
    """Flags in the prose (code spans included) are training options unless they belong to another
    program (OTHER_PROGRAMS); in code blocks, every flag after `-m ddp_train` / `-m hvd_train` is one."""
    before, _, after = training_parts()
    text = before + after
    named = set(FLAG.findall(FENCE.sub("", text))) - OTHER_PROGRAMS
    for block in FENCE.findall(text):
        for line in block.splitlines():
            match = re.search(r"(?:-m\s+(?:ddp_train|hvd_train)|\b(?:ddp|hvd)-train)\b(.*)", line)
            if match:
                named |= set(FLAG.findall(match.group(1).split("#", 1)[0]))
    unknown = sorted(named - training_flags())
    assert not unknown, (f"docs/training.md names {', '.join(unknown)}, which python -m ddp_train does not take; "
                         "fix the docs, or add a flag of another program to OTHER_PROGRAMS")


def test_the_verdicts_calibration_is_quoted_from_the_committed_result():
    from benchmarks.render import RESULTS
    from benchmarks.sections import Results, verdicts_sentence

    sentence = verdicts_sentence(Results(RESULTS), "verdicts.json")
    assert sentence.startswith("On ") and "false alarm" in sentence
    assert sentence in (DOCS / "comparing.md").read_text().replace("\n", " ")


def test_the_verdicts_sentence_names_each_false_alarm_and_bounds_only_the_other_pairs(tmp_path):
    """A same-training pair called beyond is named with its ratio, and 'no other pair comes above' is the largest
    of the rest; without one, the bound covers every pair; counts take the number they need."""
    import json

    from benchmarks.sections import Results, verdicts_sentence

    def case(name, kind, ratio, correct=True):
        judged = {"largest_band_ratio": {"ratio": ratio}, "departure_ratio": ratio / 2 if kind == "real" else None,
                  "correct": correct}
        return {"name": name, "kind": kind, "judged": {"3@30": judged, "1@30": judged}}

    def write(alarms):
        grid = [{"floor_runs": k, "margin": 30.0, "false_alarms": alarms, "misses": []} for k in (1, 3)]
        cases = [case("adam", "same", 544.0 if alarms else 0.7, correct=not alarms), case("ddp-gloo", "same", 1.8),
                 case("lr+5%", "real", 63.0)]
        (tmp_path / "verdicts.json").write_text(json.dumps({"grid": grid, "cases": cases}))
        return verdicts_sentence(Results(tmp_path), "verdicts.json")

    assert write(["adam"]) == (
        "On 2 same-training pairs and 1 pair with one real difference, 3 disturbed runs at margin 30 give 1 false "
        "alarm (adam, 544x what rounding gives) and 0 misses: no other same-training pair comes above 1.8x what "
        "rounding gives, and every real difference is called beyond it from the step it first acts, leaving it by at "
        "least 32x. One disturbed run gives 1 false alarm (adam, 544x what rounding gives) and 0 misses.")
    assert "give 0 false alarms and 0 misses: no same-training pair comes above 1.8x" in write([])


def test_the_horovod_api_figures_are_quoted_from_the_committed_results():
    from benchmarks.render import RESULTS
    from benchmarks.sections import Results, horovod_api_sentence

    sentence = horovod_api_sentence(Results(RESULTS))
    assert "passed" in sentence and "img/s" in sentence, sentence
    assert sentence in (DOCS / "horovod-api.md").read_text().replace("\n", " ")
