"""BENCHMARKS.md is what `python -m benchmarks.render` makes of the committed results."""

from __future__ import annotations

import re

from benchmarks.render import DOCUMENT, RESULTS, TEMPLATE, render
from benchmarks.sections import BLOCKS, Results


def test_benchmarks_md_is_rendered_from_the_committed_results():
    expected = render(TEMPLATE.read_text(), Results(RESULTS))
    actual = DOCUMENT.read_text()
    if actual != expected:
        lines = zip(actual.splitlines(), expected.splitlines())
        first = next((i for i, (a, e) in enumerate(lines, 1) if a != e), min(len(actual), len(expected)))
        raise AssertionError(f"BENCHMARKS.md is not what the template and benchmarks/results/ give (first difference "
                             f"near line {first}); run `python -m benchmarks.render` and commit the result")


def test_every_file_the_template_cites_is_a_result_run_all_writes():
    from test_benchmarks import run_all_writes

    cited = set()
    for call in re.findall(r"\{\{([^{}]+)\}\}", TEMPLATE.read_text()):
        name, *args = call.split()
        assert name in BLOCKS, f"{{{{{call}}}}} names no block"
        cited.update(a for a in args if a.endswith(".json"))
    assert cited and cited <= run_all_writes("full"), sorted(cited - run_all_writes("full"))
    # Every committed result is shown somewhere.
    assert set(Results(RESULTS).all_files()) <= cited
