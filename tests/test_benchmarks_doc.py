"""BENCHMARKS.md is what `python -m benchmarks.render` makes of the template and the committed results, and the
template cites every committed result (no process launched)."""

from __future__ import annotations

from benchmarks.render import BLOCKS, DOCUMENT, PLACEHOLDER, RESULTS, TEMPLATE, render
from benchmarks.sections import SECTIONS, Results
from benchmarks.stale import run_all_steps


def test_benchmarks_md_is_rendered_from_the_committed_results():
    expected, actual = render(TEMPLATE.read_text(), Results(RESULTS)), DOCUMENT.read_text()
    if actual != expected:
        pairs = zip(actual.splitlines(), expected.splitlines(), strict=False)
        first = next((i for i, (a, e) in enumerate(pairs, 1) if a != e), min(len(actual), len(expected)))
        raise AssertionError(f"BENCHMARKS.md is not what the template and benchmarks/results/ give (first difference "
                             f"near line {first}); run `python -m benchmarks.render` and commit the result")


def test_the_template_cites_every_result_a_step_writes_and_each_has_a_section():
    cited = [call.split()[0] for call in PLACEHOLDER.findall(TEMPLATE.read_text())]
    files = {word for word in cited if word not in BLOCKS}
    assert files == set(run_all_steps()), "the template and run_all.sh's steps must name the same results"
    assert set(Results(RESULTS).all_files()) <= files
    assert {name.rsplit("/", 1)[-1].removesuffix(".json") for name in files} <= set(SECTIONS)
