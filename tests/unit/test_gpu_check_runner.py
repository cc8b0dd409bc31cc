"""The GPU check's runner (scripts/gpu_check/runner.py) on its step table and on steps that launch nothing: the order
the steps run in, the Horovod build started after ddp and waited for before compare, the time boxes, the skip
reasons and the lines printed. tests/test_gpu_check.py runs the real steps."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

from scripts.gpu_check.cli import write
from scripts.gpu_check.context import Context, Launch, Settings, Skipped, StepFailed
from scripts.gpu_check.runner import NAMES, STEPS, Runner, time_box

#: the record's order, as docs/gpu-check.md's table and tests/test_gpu_check.py have it
ORDER = ["install", "ddp", "amp_fp16", "amp_bf16", "channels_last", "exact", "horovod_api", "horovod_build",
         "compare"]
SPEC = {spec.name: spec for spec in STEPS}


def test_the_list_orders_the_record_and_can_be_run():
    assert list(NAMES) == ORDER
    assert [(spec.name, spec.issue_step) for spec in STEPS if spec.issue_step == 2] == [
        ("amp_fp16", 2), ("amp_bf16", 2), ("channels_last", 2)]
    assert [spec.name for spec in STEPS if not spec.required] == ["horovod_build"]
    # One background step, its action a pair (its command, what it records), started after a foreground step and
    # waited for before a later one; every other step's action runs in its turn; the prerequisite is a foreground one.
    background = [spec for spec in STEPS if spec.starts_after or spec.joined_before]
    assert [spec.name for spec in background] == ["horovod_build"]
    build = background[0]
    assert isinstance(build.action, tuple) and len(build.action) == 2 and all(map(callable, build.action))
    assert all(callable(spec.action) for spec in STEPS if spec is not build)
    assert ORDER.index(build.starts_after) < ORDER.index(build.name) < ORDER.index(build.joined_before)
    assert [spec.name for spec in STEPS if spec.left_out] == ["install"]


def test_time_boxes_keep_back_the_later_selected_steps():
    everything = NAMES
    # On a GPU the steps after install keep back 200 s: with the whole budget install gets its box.
    assert time_box(SPEC["install"], STEPS, everything, "cuda", 480) == 90
    assert time_box(SPEC["install"], STEPS, everything, "cuda", 250) == 50
    assert time_box(SPEC["install"], STEPS, ["install", "ddp"], "cpu", 100) == 85
    assert time_box(SPEC["compare"], STEPS, everything, "cpu", 40) == 40
    assert time_box(SPEC["exact"], STEPS, everything, "cuda", 100) == 100 - 25 - 45
    # The build keeps back compare's reserve where compare was selected.
    assert time_box(SPEC["horovod_build"], STEPS, everything, "cuda", 480) == 240
    assert time_box(SPEC["horovod_build"], STEPS, everything, "cuda", 200) == 155
    assert time_box(SPEC["horovod_build"], STEPS, everything, "cpu", 200) == 170
    assert time_box(SPEC["horovod_build"], STEPS, ["ddp", "horovod_build"], "cuda", 200) == 200


class Fake:
    def __init__(self, done: list, fails: bool = False, skips: str | None = None) -> None:
        self.done, self.fails, self.skips = done, fails, skips

    def run(self, ctx, record, until) -> None:
        self.done.append(("run", record.name, record.limit_s))
        if self.skips:
            raise Skipped(self.skips)
        if self.fails:
            raise StepFailed("exit code 2: made to fail")

    def left_out(self, ctx, record, until) -> None:
        self.done.append(("left_out", record.name, record.limit_s))


class FakeBuild:
    def __init__(self, done: list) -> None:
        self.done = done
        self.background = (self.prepare, self.finished)

    def prepare(self, ctx, record) -> Launch:
        self.done.append(("prepare", record.name, None))
        raise Skipped("Horovod 0.28.1 is installed already (not rebuilt)")

    def finished(self, ctx, record, output) -> None:
        raise AssertionError("never started")


def check(tmp_path, only=tuple(ORDER), fail=(), skip=None, build=None, budget=None) -> tuple[Runner, list]:
    """A runner of the table with fake steps; `build` (FakeBuild by default) is the Horovod build's class."""
    settings = Settings(device="cpu", python=sys.executable, work=tmp_path / "work", out=tmp_path / "out",
                        carry=tmp_path, budget=300.0, only=tuple(only), force_fail=(), build_wanted="auto",
                        nproc_wanted=None)
    done: list = []
    fakes = {name: Fake(done, fails=name in fail, skips=(skip or {}).get(name)) for name in ORDER}
    specs = [replace(spec, action=(build or FakeBuild)(done).background) if spec.starts_after else
             replace(spec, action=fakes[spec.name].run, left_out=spec.left_out and fakes[spec.name].left_out)
             for spec in STEPS]
    runner = Runner(specs, Context(settings), settings.budget if budget is None else budget)
    return runner, done


def test_the_build_starts_after_ddp_and_is_waited_for_before_compare(tmp_path, capsys):
    runner, done = check(tmp_path, skip={"amp_fp16": "CUDA only"})
    assert runner.run() is None
    assert [(what, name) for what, name, _ in done] == [
        ("run", "install"), ("run", "ddp"), ("prepare", "horovod_build"), ("run", "amp_fp16"), ("run", "amp_bf16"),
        ("run", "channels_last"), ("run", "exact"), ("run", "horovod_api"), ("run", "compare")]
    records = runner.records
    assert all(records[name].outcome == "ok" and records[name].limit_s for name in ORDER
               if name not in ("amp_fp16", "horovod_build"))
    assert records["amp_fp16"].outcome == "skipped" and records["amp_fp16"].reason == "CUDA only"
    build = records["horovod_build"]
    assert build.outcome == "skipped" and build.started_s is not None and build.limit_s is None
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"[gpu_check] {name}" for name in ORDER]
    assert lines[-2] == "[gpu_check] horovod_build: skipped in 0.0 s (Horovod 0.28.1 is installed already " \
                        "(not rebuilt))"


def test_a_failed_install_skips_the_rest_and_fails_the_check(tmp_path, capsys):
    runner, done = check(tmp_path, fail=("install",))
    assert runner.run() is None
    assert done == [("run", "install", 120)]  # on CPU its box: the later steps keep back 130 s of 300
    assert all(runner.records[name].reason == "step install failed" for name in ORDER[1:])
    # the steps it blocked print no line, the build neither (their reason is in the record)
    assert capsys.readouterr().out.splitlines() == ["[gpu_check] install: failed in 0.0 s: exit code 2: made to fail"]
    assert runner.records["horovod_build"].reason == "step install failed"
    settings = runner.ctx.settings
    settings.out.mkdir()
    assert write(runner, None) == 1
    record = json.loads((settings.out / "gpu_check.json").read_text())
    assert record["failed"] == ["install"] and [step["name"] for step in record["steps"]] == ORDER
    assert record["steps"][0]["issue_step"] == 0 and record["steps"][7]["required"] is False


def test_steps_left_out_are_skipped_but_install_still_probes(tmp_path, capsys):
    runner, done = check(tmp_path, only=("amp_bf16",))
    runner.run()
    assert [(what, name) for what, name, _ in done] == [("left_out", "install"), ("run", "amp_bf16")]
    assert done[0][2] == 120  # install's box: amp_bf16 keeps back 15 s of 300
    assert all(runner.records[name].reason == "not in GPU_CHECK_STEPS" for name in ORDER if name != "amp_bf16")
    # a step not selected prints no line, a background one neither
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == ["[gpu_check] amp_bf16"]


class StartedBuild(FakeBuild):
    """A build that starts a command (which exits at once)."""

    def prepare(self, ctx, record) -> Launch:
        self.done.append(("prepare", record.name, None))
        return Launch([sys.executable, "-c", "pass"], shown="build", env=dict(os.environ))

    def finished(self, ctx, record, output) -> None:
        self.done.append(("finished", record.name, record.limit_s))


def test_the_builds_box_is_rounded_and_a_build_without_time_fails_with_its_line(tmp_path, capsys):
    # a budget whose seconds left are not round
    runner, done = check(tmp_path, only=("ddp", "horovod_build"), build=StartedBuild, budget=100.0 / 3)
    runner.run()
    build = runner.records["horovod_build"]
    assert build.outcome == "ok" and build.limit_s == round(build.limit_s, 1) and 0 < build.limit_s <= 100 / 3
    assert ("finished", "horovod_build", build.limit_s) in done
    capsys.readouterr()

    # nothing left once ddp has run
    runner, done = check(tmp_path, only=("ddp", "horovod_build"), build=StartedBuild, budget=0.0)
    runner.run()
    build = runner.records["horovod_build"]
    assert build.outcome == "failed" and build.error == "no time left in the budget of 300 s", build
    assert not [entry for entry in done if entry[0] == "finished"] and build.commands == []
    lines = capsys.readouterr().out.splitlines()
    assert "[gpu_check] horovod_build: failed in" in "\n".join(lines) and len(lines) == 2, lines


def test_a_started_build_is_waited_for_before_compare(tmp_path, capsys):
    runner, done = check(tmp_path, skip={"amp_fp16": "CUDA only"}, build=StartedBuild)
    assert runner.run() is None
    assert [(what, name) for what, name, _ in done] == [
        ("run", "install"), ("run", "ddp"), ("prepare", "horovod_build"), ("run", "amp_fp16"), ("run", "amp_bf16"),
        ("run", "channels_last"), ("run", "exact"), ("run", "horovod_api"), ("finished", "horovod_build"),
        ("run", "compare")]
    build = runner.records["horovod_build"]
    # its box counted when it started: the budget left (300 s) less what compare keeps back (30 s on CPU)
    assert build.outcome == "ok" and build.commands == ["build"] and build.limit_s == 270 and build.seconds > 0
    assert build.started_s is not None and build.started_s <= runner.records["amp_fp16"].started_s
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"[gpu_check] {name}" for name in ORDER]
