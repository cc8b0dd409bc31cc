"""benchmarks.engine_startup without starting an engine: the medians of its drivers' rows and its section."""

from __future__ import annotations

from benchmarks import engine_startup
from benchmarks.sections import section


def _row(engine: str, n: int, call: int, scale: float) -> dict:
    return {"engine": engine, "workers": n, "call": call, "engine_start_s": 10 * scale, "to_fn_s": 1 * scale,
            "to_first_step_s": 2 * scale, "to_result_s": 3 * scale}


def test_medians_per_engine_workers_and_call_spark_first():
    rows = [_row("ray", 2, 1, s) for s in (1, 3, 2)] + [_row("spark", 4, 2, 5), _row("spark", 2, 1, 1)]
    found = engine_startup.medians(rows)
    assert [(r["engine"], r["workers"], r["call"], r["repeats"]) for r in found] == [
        ("spark", 2, 1, 1), ("spark", 4, 2, 1), ("ray", 2, 1, 3)]
    assert found[2]["to_result_s"] == 6 and found[2]["engine_start_s"] == 20


def test_the_section_shows_each_row_and_a_failed_driver():
    result = {"benchmark": "engine_startup", "settings": {"repeats": 3},
              "rows": engine_startup.medians([_row("spark", 2, 1, 1), _row("ray", 4, 2, 0.01)]),
              "failures": [{"case": "ray, 4 workers, repeat 0", "error": "the ray driver exited 1: boom"}]}
    text = section(result)
    assert "| spark | 2 | first | 10.0 | 1.00 | 2.00 | 3.00 |" in text
    assert "| ray | 4 | next | 0.1 | 0.01 | 0.02 | 0.03 |" in text
    assert "**FAILED** ray, 4 workers, repeat 0" in text and "boom" in text


def test_bad_engines_are_refused_in_one_line(capsys):
    assert engine_startup.main(["--engines", "dask"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
