"""Comparing users' own training scripts, unmodified (--scripts, common.probe): a Horovod script in the style of
Horovod's examples/pytorch/pytorch_mnist.py and its faithful DDP port are bitwise identical at 2 ranks and within
the noise floor at 3; five DDP ports with one mistake each are reported from the step they part at, with the
mistake named; what the probe cannot follow is refused in one line; the scripts are never changed or copied.

The scripts are examples/migrating's pair (their own loop, DistributedSampler, lr x size, broadcast_parameters,
broadcast_optimizer_state, DistributedOptimizer / DDP), written into a folder of the test with its edits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from launched import REPO, assert_summary_leads, compare_backends, compare_in_process, run_cmd
from common.launch.userscript import safe_path_env
from common.rundir.names import CONFIG_FILE, METRICS_FILE, MODEL_FILE, SUMMARY_FILE, WORKING_DIR
from userscripts import RUN_BY, SCRIPT_ARGS, edited, probe_run, probed, sha256, write_folder

pytestmark = pytest.mark.timeout(900)

#: the mistake of each DDP port: (file, edits)
SUMMED_HOOK = """model = DDP(model)

    def allreduce_sum(state, bucket):  # sums the gradients: the division by the world size is forgotten
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    model.register_comm_hook(None, allreduce_sum)
"""
SCRIPTS = {
    "train_horovod.py": ("train_horovod.py", ()),
    "train_ddp.py": ("train_ddp.py", ()),
    "ddp_lr.py": ("train_ddp.py", (("lr=args.lr * dist.get_world_size()", "lr=args.lr"),)),
    "ddp_set_epoch.py": ("train_ddp.py", (("train_sampler.set_epoch(epoch)", "pass"),)),
    "ddp_seed.py": ("train_ddp.py", (("torch.manual_seed(args.seed)", "torch.manual_seed(args.seed + rank)"),
                                     ("model = DDP(model)", "model = DDP(model, init_sync=False)"))),
    "ddp_summed.py": ("train_ddp.py", (("model = DDP(model)\n", SUMMED_HOOK),)),
    # SGD with weight decay on both sides: Horovod's broadcast_optimizer_state takes a step on a fresh optimizer
    "horovod_decay.py": ("train_horovod.py",
                         (("momentum=args.momentum)", "momentum=args.momentum, weight_decay=0.01)"),)),
    "ddp_decay.py": ("train_ddp.py", (("momentum=args.momentum)", "momentum=args.momentum, weight_decay=0.01)"),)),
}


#: the user's own module called `common`, which the scripts import (as Horovod's test utilities are): the probe must
#: leave it theirs
USERS_COMMON = 'RUN_BY_LOG = "run-by.log"\n'


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A user's folder: the scripts, their data and net modules and their own `common.py`, which every script
    imports; epochs of 0-based set_epoch in both scripts of the pair, so that an epoch repeated shows from the
    first step of epoch 2."""
    here = tmp_path_factory.mktemp("user")
    scripts = {}
    for name, (source, edits) in SCRIPTS.items():
        epoch0 = ("train_sampler.set_epoch(epoch)", "train_sampler.set_epoch(epoch - 1)")
        edits = tuple(edits) if any(old == epoch0[0] for old, _ in edits) else (*edits, epoch0)
        scripts[name] = (source, edits)
    write_folder(here, scripts)
    (here / "common.py").write_text(USERS_COMMON)
    for name in SCRIPTS:  # the run-by line opens the file common.py names
        script = here / name
        script.write_text(script.read_text().replace(RUN_BY, "from common import RUN_BY_LOG\n"
                                                     + RUN_BY.replace('"run-by.log"', "RUN_BY_LOG")))
    return here


#: the faithful comparison's noise floor at 3 ranks: disturbances 1 (away from zero) and 2 (toward zero). Its band and
#: outcome range are the widest of these two runs, so a pair within it is within the default floor too (a third run)
FLOOR_RUNS = 2


@pytest.fixture(scope="module")
def faithful(folder):
    """The Horovod script and its faithful port compared at 2 and 3 ranks: (summary, out, sha256 of every file
    before)."""
    before = {p.name: sha256(p) for p in folder.iterdir() if p.is_file()}
    out = folder / "compare"
    result = compare_backends("--scripts", "train_horovod.py", "train_ddp.py", "--np", "2,3", "--hvd-controllers",
                              "gloo", "--repeats", "1", "--floor-runs", FLOOR_RUNS, "--out", out, "--", *SCRIPT_ARGS,
                              cwd=folder)
    assert result.returncode == 0, result.output[-4000:]
    return json.loads((out / SUMMARY_FILE).read_text()), out, before


def pair_at(summary: dict, np: int) -> dict:
    pairs = [p for p in summary["parity"] if p["world_size"] == np and not p["a"].count("+perturbed")
             and not p["b"].count("+perturbed") and {p["a"].split("@")[0], p["b"].split("@")[0]} ==
             {"ddp", "horovod-gloo"}]
    assert len(pairs) == 1, summary["parity"]
    return pairs[0]


def test_faithful_port_is_bitwise_identical_at_2_ranks_and_within_the_floor_at_3(faithful):
    summary, out, _ = faithful
    at2, at3 = pair_at(summary, 2), pair_at(summary, 3)
    assert at2["bitwise_identical"], at2
    assert at3["bitwise_identical"] or at3["within_noise_floor"] is True, at3
    assert at3["trains_differently_from"] is None and "beyond" not in at3["verdict"]
    assert at2.get("cause") is None and at3.get("cause") is None
    report = (out / "report.md").read_text()
    assert "train_horovod.py" in report and "train_ddp.py" in report
    assert_summary_leads(out)


def test_the_runs_hold_what_the_scripts_did(faithful, folder):
    summary, out, _ = faithful
    for run_dir in (out / "runs").iterdir():
        config = json.loads((run_dir / CONFIG_FILE).read_text())
        events = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
        script = config["script"]
        # each run started in a working directory of its own, linked to the user's folder
        assert config["backend"]["script"] and script["cwd"] == str(run_dir.resolve() / WORKING_DIR)
        assert Path(script["path"]).resolve().parent == folder.resolve()
        assert script["argv"] == SCRIPT_ARGS and Path(script["path"]).name in ("train_horovod.py", "train_ddp.py")
        assert script["sha256"] == sha256(Path(script["path"]))
        steps = [e for e in events if e["event"] == "step"]
        per_epoch = math.ceil(math.ceil(1438 / config["world_size"]) / 64)
        assert [e["step"] for e in steps] == list(range(1, 2 * per_epoch + 1))
        assert all(math.isfinite(e["loss"]) and len(e["wnorm"]) == len(config["parameters"]) for e in steps)
        assert (run_dir / MODEL_FILE).exists() and json.loads((run_dir / SUMMARY_FILE).read_text())["weights_sha256"]


def test_scripts_are_never_changed_copied_or_run_by_the_comparison(faithful, folder):
    summary, out, before = faithful
    assert {p.name: sha256(p) for p in folder.iterdir() if p.is_file() and p.name in before} == before
    copies = [p for p in out.rglob("*.py") if not p.is_symlink()]  # each run's working directory links them
    assert not copies, copies
    # what each run wrote (run-by.log, relative) is in its own working directory, not the user's folder
    assert not (folder / "run-by.log").exists()
    for run in summary["runs"]:
        ran = (Path(run["path"]) / WORKING_DIR / "run-by.log").read_text().split()
        assert "none" not in ran and len(ran) == run["world_size"], (run["name"], ran)


def test_a_disturbed_script_run_starts_one_ulp_away_and_says_so(faithful):
    """The noise floor's runs of a script: the probe moves the initial weights by one ulp at the first forward."""
    summary, out, _ = faithful
    # the floor's second disturbance (--perturb-ulp 1 --perturb-pattern 2, a value other than the default)
    run_dir = out / "runs" / "ddp+perturbed2-np3-r1"
    config = json.loads((run_dir / CONFIG_FILE).read_text())
    assert (config["config"]["perturb_ulp"], config["config"]["perturb_pattern"]) == (1, 2)

    def start(path):
        return next(json.loads(line) for line in (path / METRICS_FILE).read_text().splitlines()
                    if json.loads(line)["event"] == "start")

    plain, moved = start(out / "runs" / "ddp-np3-r1"), start(run_dir)
    gaps = [abs(a - b) / a for a, b in zip(plain["wnorm"], moved["wnorm"], strict=True) if a]
    assert gaps and all(0 < g < 2.0 ** -20 for g in gaps), gaps  # every tensor moved, by about an ulp
    assert len(moved["ranks"]) == 3 and all(r == moved["ranks"][0] for r in moved["ranks"])  # on every rank alike


@pytest.fixture(scope="module")
def horovod_runs(folder, faithful):
    """The Horovod scripts run under the probe at 2 ranks: train_horovod.py's is the faithful comparison's run (the
    command probe_run starts, from this folder), horovod_decay.py's is launched here."""
    _, out, _ = faithful
    return {"train_horovod.py": out / "runs" / "horovod-gloo-np2-r1",
            "horovod_decay.py": probe_run(folder, "horovodrun-gloo", "horovod_decay.py")}


@pytest.fixture(scope="module")
def ddp_runs(folder):
    """The DDP ports run under the probe at 2 ranks, each launched once for the module's tests: port -> its run
    directory."""
    made = {}

    def run(port: str) -> Path:
        if port not in made:
            made[port] = probe_run(folder, "torchrun", port)
        return made[port]

    return run


def explained(folder: Path, horovod: Path, ddp: Path) -> dict:
    out = folder / f"why-{ddp.name}"
    result = compare_in_process("--runs", horovod, ddp, "--noise-floor", "off", "--out", out)
    assert result.returncode == 0, result.output[-3000:]
    pairs = json.loads((out / SUMMARY_FILE).read_text())["parity"]
    assert len(pairs) == 1
    pair = pairs[0]
    assert pair["cause"]["text"] in pair["verdict"] and pair["cause"]["guide"] in pair["verdict"]
    guide = (REPO / pair["cause"]["guide"].split("#")[0]).read_text()
    anchor = pair["cause"]["guide"].split("#")[1]
    assert any(line.startswith("## ") and line[3:].strip().lower().replace(" ", "-").replace("`", "") == anchor
               for line in guide.splitlines()), anchor
    return pair


PER_EPOCH_AT_2 = math.ceil(math.ceil(1438 / 2) / 64)


# `parts`: the first step whose forward pass sees another loss or other weights; `step`: the step the cause
# acts on (a step's update shows in the next step's weights; None: before training).
@pytest.mark.parametrize("port, horovod, parts, step, quantity, words", [
    ("ddp_lr.py", "train_horovod.py", 2, 1, "optimizer settings", ["lr", "the world size, 2"]),
    ("ddp_set_epoch.py", "train_horovod.py", PER_EPOCH_AT_2 + 1, PER_EPOCH_AT_2 + 1, "inputs", ["set_epoch"]),
    ("ddp_seed.py", "train_horovod.py", 2, None, "initial weights", ["start from different weights", "broadcast"]),
    ("ddp_decay.py", "horovod_decay.py", 1, 1, "optimizer steps before training",
     ["broadcast_optimizer_state", "weight decay 0.01"]),
    ("ddp_summed.py", "train_horovod.py", 2, 1, "gradients", ["summed", "2x"]),
])
def test_a_mistake_is_named_at_the_step_it_acts_on(folder, horovod_runs, ddp_runs, port, horovod, parts, step,
                                                     quantity, words):
    pair = explained(folder, horovod_runs[horovod], ddp_runs(port))
    assert pair["first_differing_step"] == parts, pair
    cause = pair["cause"]
    assert cause["quantity"] == quantity and cause["step"] == step, cause
    assert all(w in cause["text"] for w in words), cause["text"]


def test_runs_of_scripts_without_a_floor_say_how_to_make_one(folder, horovod_runs, ddp_runs):
    out = folder / "no-floor"
    result = compare_in_process("--runs", horovod_runs["train_horovod.py"], ddp_runs("ddp_lr.py"), "--out", out)
    assert result.returncode == 0, result.output[-3000:]
    (pair,) = json.loads((out / SUMMARY_FILE).read_text())["parity"]
    assert pair["within_noise_floor"] is None and "has no training options to rerun" in pair["verdict"], pair
    assert "--scripts" in pair["verdict"] and not (out / "runs").exists()


@pytest.mark.parametrize("script, says", [
    ("two_optimizers.py", "two optimizers step"),
    ("missing.py", "no such file"),
])
def test_what_the_probe_cannot_follow_is_refused_in_one_line(folder, script, says):
    if script == "two_optimizers.py":
        (folder / script).write_text(edited("train_ddp.py", (
            "    for epoch in range(1, args.epochs + 1):",
            "    scale = torch.nn.Parameter(torch.ones(3))  # a second model, with an optimizer of its own\n"
            "    other = optim.SGD([scale], lr=0.1)\n"
            "    (scale ** 2).sum().backward(); other.step()\n"
            "    for epoch in range(1, args.epochs + 1):")))
    # one rank: each process of a job finds what the probe cannot follow on its own
    # as the comparison starts it (the folder holds the user's own common.py: common.launch.userscript)
    result = run_cmd(probed("torchrun", 1, folder / "refused" / script, script), timeout=300, cwd=folder,
                     env=safe_path_env({}))
    assert result.returncode != 0
    lines = [line for line in result.output.splitlines() if "probe: error:" in line]
    assert lines and all(says in line for line in lines), result.output[-3000:]
    # torchrun reports the failed ranks with its own traceback; neither the probe nor the script raised
    assert script not in "".join(line for line in result.output.splitlines(True) if line.lstrip().startswith("File "))
    assert "common/probe" not in result.output


def test_scripts_options_are_checked_before_anything_runs(folder, monkeypatch):
    monkeypatch.chdir(folder)  # the scripts are named from the user's folder
    for args, says in [(["--scripts", "train_ddp.py", "train_horovod.py"], "give the Horovod script first"),
                       (["--scripts", "train_horovod.py", "train_ddp.py", "--lr", "0.1"], "after --"),
                       (["--np", "2", "--", "--epochs", "1"], "they go with --scripts"),
                       (["--scripts", "nowhere.py"], "cannot be read"),
                       (["--port", "nowhere.py"], "--port nowhere.py: no such file"),
                       (["--port", "train_horovod.py", "--epochs", "1"], "with --port your script's arguments go "
                                                                         "after --")]:
        result = compare_in_process(*args, "--out", folder / "refused-compare")
        assert result.returncode == 2 and says in result.output, (args, result.output[-2000:])
        assert not (folder / "refused-compare" / "runs").exists()
        assert not (folder / "refused-compare" / "port.json").exists()  # refused before the port was written
