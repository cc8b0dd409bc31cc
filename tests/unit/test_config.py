"""The training options (common.config): parsed once, abbreviations refused, what was given known from the parser,
the checks across options and of the run directory (no process launched)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.config import Config, UsageError, check_run_dir, given_options, parse_config
from common.loop.backend import Tuning


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as leaving:
        parse_config(argv, "train", "test")
    assert leaving.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_only_the_options_given_are_given():
    assert given_options(["--lr", "0.1", "--model-arg", "a=1", "--model-arg", "b=2", "--deterministic"], "train") == \
        {"lr": 0.1, "model_arg": ("a=1", "b=2"), "deterministic": True}
    assert given_options([], "train") == {}
    config = parse_config(["--lr", "0.1"], "train", "test")
    assert config == Config(lr=0.1)


def test_an_abbreviated_option_is_refused_not_read_as_another(capsys):
    line = refused(["--batch", "16", "--reduction", "exact"], capsys)
    assert line == "train: error: unrecognized arguments: --batch 16 (see --help)"


def test_options_that_set_one_thing_twice_are_refused(capsys):
    assert "--global-batch and --batch-size both set the batch" in refused(
        ["--global-batch", "64", "--batch-size", "32"], capsys)
    assert "--batch-size does not apply to --reduction exact" in refused(
        ["--batch-size", "32", "--reduction", "exact"], capsys)
    # the default batch size is no batch size given
    assert parse_config(["--reduction", "exact"], "train", "test").exact


def test_a_run_directory_that_cannot_be_made_is_refused_and_nothing_is_made(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(UsageError, match="is not a directory"):
        check_run_dir(str(blocker / "run"))
    with pytest.raises(UsageError, match="cannot be created in /proc"):
        check_run_dir("/proc/x/run")
    check_run_dir(str(tmp_path / "new" / "run"))
    assert sorted(os.listdir(tmp_path)) == ["file"]  # checked, not made
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(UsageError):
            check_run_dir(str(locked / "run"))


def test_a_backends_tuning_is_the_runs_config():
    config = Config(compression="fp16", bucket_mb=1.5, accumulate=2)
    tuning = Tuning(config, gradient_bytes=1024)
    assert tuning.config.compression == "fp16" and tuning.config.bucket_mb == 1.5 and tuning.gradient_bytes == 1024
    assert Tuning().config == Config()
