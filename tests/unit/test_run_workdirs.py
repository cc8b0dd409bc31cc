"""Each run of a user's scripts starts in a working directory of its own (common.compare.workdir), {run_dir} in the
scripts' arguments is each run's directory (common.launch.userscript), and what runs share on disk is named when a
run starts with what an earlier run wrote (common.compare.clashes): on folders made here, no launch."""

from __future__ import annotations

import os
from pathlib import Path

from common.compare.clashes import Watch, named_paths, with_run_dir
from common.compare.workdir import LinkedFolder, absolute_climbs, as_run_gives_it
from common.launch.userscript import fill_run_dir


def user_folder(here: Path) -> Path:
    """A user's folder: a script, a config, a package, and the comparison's output under runs/compare."""
    here.mkdir()
    (here / "train.py").write_text("print('hi')\n")
    (here / "data.json").write_text("{}\n")
    (here / "mypkg").mkdir()
    (here / "mypkg" / "__init__.py").write_text("")
    (here / "runs" / "compare" / "runs").mkdir(parents=True)
    (here / "runs" / "earlier").mkdir()
    return here


def test_a_working_directory_links_the_folder_less_the_comparisons_output(tmp_path):
    here = user_folder(tmp_path / "user")
    out = here / "runs" / "compare"
    cwd = LinkedFolder(here, left_out=(out,)).make(out / "runs" / "ddp-np2-r1" / "cwd")
    assert sorted(p.name for p in cwd.iterdir()) == ["data.json", "mypkg", "runs", "train.py"]
    assert all((cwd / name).is_symlink() for name in ("data.json", "mypkg", "train.py"))
    assert os.readlink(cwd / "train.py") == str(here / "train.py")
    # runs/ holds the output: a folder of its own, with the rest of runs/ linked
    assert not (cwd / "runs").is_symlink() and sorted(p.name for p in (cwd / "runs").iterdir()) == ["earlier"]
    # what the run creates stays in its directory; the user's folder is as it was
    (cwd / "ckpt-0.pt").write_text("state")
    assert not (here / "ckpt-0.pt").exists()


def test_the_ports_runs_link_the_port_in_place_of_the_scripts_folder(tmp_path):
    here = user_folder(tmp_path / "user")
    port = here / "runs" / "compare" / "port"
    port.mkdir()
    (port / "train.py").write_text("print('ported')\n")
    whole = LinkedFolder(here, replaced=((here, port),), left_out=(here / "runs" / "compare",))
    cwd = whole.make(tmp_path / "a")
    assert sorted(p.name for p in cwd.iterdir()) == ["train.py"]
    assert (cwd / "train.py").read_text() == "print('ported')\n"
    assert whole.roots() == [port]
    nested = LinkedFolder(here, replaced=((here / "mypkg", port),)).make(tmp_path / "b")
    assert os.readlink(nested / "mypkg") == str(port) and os.readlink(nested / "data.json") == str(here / "data.json")


def test_scripts_and_arguments_are_given_as_they_reach_the_users_files_from_a_run(tmp_path):
    here = user_folder(tmp_path / "user")
    assert as_run_gives_it("train.py", here) == "train.py"
    assert as_run_gives_it("mypkg/__init__.py", here) == "mypkg/__init__.py"
    assert as_run_gives_it("../elsewhere/train.py", here) == str(tmp_path / "elsewhere" / "train.py")
    assert absolute_climbs(["--data", "../data", "--cfg=../c.json", "--epochs", "2", "data/x"], here) == (
        "--data", str(tmp_path / "data"), f"--cfg={tmp_path / 'c.json'}", "--epochs", "2", "data/x")


def test_run_dir_in_the_arguments_is_each_runs_directory():
    assert fill_run_dir(["--checkpoint", "{run_dir}/ck.pt", "--epochs", "2"], "/out/runs/ddp-np2-r1") == (
        "--checkpoint", "/out/runs/ddp-np2-r1/ck.pt", "--epochs", "2")
    assert with_run_dir("--checkpoint /tmp/ck.pt", Path("/tmp/ck.pt")) == "--checkpoint {run_dir}/ck.pt"
    assert with_run_dir("--checkpoint=/tmp/ck.pt", Path("/tmp/ck.pt")) == "--checkpoint={run_dir}/ck.pt"


def test_the_absolute_paths_every_run_is_given_are_watched_those_with_run_dir_are_not():
    assert named_paths(["--checkpoint", "/tmp/ck.pt", "--out={run_dir}/x", "--dir=/data/set", "/abs", "--dev",
                        "/dev/null", "--epochs", "2", "rel/x"]) == {
        Path("/tmp/ck.pt"): "--checkpoint /tmp/ck.pt", Path("/data/set"): "--dir=/data/set", Path("/abs"): "/abs"}


def test_a_run_that_starts_with_a_file_an_earlier_run_wrote_is_a_clash(tmp_path):
    here = user_folder(tmp_path / "user")
    shared = tmp_path / "shared"
    shared.mkdir()
    checkpoint = shared / "ck.pt"
    watch = Watch([here], named_paths(["--checkpoint", str(checkpoint)]), [here / "runs" / "compare"])
    assert watch.before("horovod-api@2#1") is None
    checkpoint.write_text("epoch 1")
    (here / "runs" / "compare" / "runs" / "model.pt").write_text("the comparison's own")  # left out
    watch.after("horovod-api@2#1")
    clash = watch.before("horovod-gloo@2#1")
    assert clash is not None and (clash.run, clash.earlier, clash.path) == ("horovod-gloo@2#1", "horovod-api@2#1",
                                                                          checkpoint)
    assert clash.line() == (
        f"horovod-gloo@2#1 started with {checkpoint}, which horovod-api@2#1 wrote before it: every run is given "
        f"`--checkpoint {checkpoint}`; give each run its own with {{run_dir}}, which the comparison fills with the "
        "run's directory: `--checkpoint {run_dir}/ck.pt`")
    watch.after("horovod-gloo@2#1")
    assert watch.notes() == []


def test_a_file_written_into_the_users_folder_through_a_link_is_named(tmp_path):
    here = user_folder(tmp_path / "user")
    watch = Watch([here], {}, [here / "runs" / "compare"])
    assert watch.before("ddp@2#1") is None
    cwd = LinkedFolder(here).make(tmp_path / "cwd")
    (cwd / "mypkg" / "state.pt").write_text("written through the link")
    (cwd / "mypkg" / "__pycache__").mkdir()
    (cwd / "mypkg" / "__pycache__" / "x.pyc").write_text("python's cache, no run's output")
    (cwd / "new.txt").write_text("stays in the run's own directory")
    watch.after("ddp@2#1")
    clash = watch.before("horovod-gloo@2#1")
    assert clash is not None and clash.path == here / "mypkg" / "state.pt" and clash.others == 0
    assert f"in {here} through the link in its working directory" in clash.line() and "{run_dir}" in clash.line()
    (note,) = watch.notes()
    assert note.startswith(f"ddp@2#1 wrote {here / 'mypkg' / 'state.pt'} in your folder"), note
