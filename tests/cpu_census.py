"""The CPU seconds each test's setup, call and teardown cost, summed over the processes they started: the suite runs
on two cores it keeps busy, so its time is the CPU its tests spend, and a test's duration (which also counts the
other worker's load and its own waits) does not say which tests to make cheaper. The summary at the end of a run
lists the most expensive and each module's total.

A phase's CPU is that of the pytest process and of every child it waited for, their own children included where
each waited for its own (a launcher for its ranks); ranks started over ssh on the simulated cluster's other host
are not counted."""

from __future__ import annotations

import resource
from collections import defaultdict
from typing import Dict, Iterator, List, Tuple

import pytest

#: the name a phase's CPU seconds carry in its report's user_properties (they reach the xdist controller with it)
PROPERTY = "cpu_s"
SHOWN = 15


def cpu_seconds() -> float:
    """User and system seconds of this process and of the children it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _measured(item: pytest.Item, phase: str) -> Iterator[None]:
    started = cpu_seconds()
    yield
    item.stash.setdefault(_SPENT, {})[phase] = cpu_seconds() - started


_SPENT = pytest.StashKey[Dict[str, float]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _measured(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _measured(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _measured(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    spent = item.stash.get(_SPENT, {}).get(call.when)
    if spent is not None:
        outcome.get_result().user_properties.append((PROPERTY, spent))


def pytest_terminal_summary(terminalreporter) -> None:
    """The phases that cost the most CPU, each module's total, and the whole run's."""
    phases: List[Tuple[float, str]] = []
    modules: Dict[str, float] = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()):
                if name == PROPERTY:
                    phases.append((value, f"{report.when:8} {report.nodeid}"))
                    modules[report.nodeid.split("::")[0]] += value
    if not phases:
        return
    terminalreporter.write_sep("=", f"most CPU: {SHOWN} phases, then by module (this host's processes)")
    for value, where in sorted(phases, reverse=True)[:SHOWN]:
        terminalreporter.write_line(f"{value:8.1f} CPU-s {where}")
    terminalreporter.write_line("")
    for module, value in sorted(modules.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{value:8.1f} CPU-s {module}")
    terminalreporter.write_line(f"{sum(modules.values()):8.1f} CPU-s in all")
