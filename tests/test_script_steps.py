"""`compare-backends --scripts A B --steps N`, as a user runs it (the default Horovod controllers, Gloo and MPI): on
scripts whose epochs are far longer than N steps, every run ends after its step N with a complete run directory, and
each run ends with the same weights, and every pair with the same verdict, as the comparison of the same scripts
given exactly N steps of data.

The scripts are examples/migrating's pair with two edits: `--samples K` trains on the first K samples, and the
training sampler keeps the data's order, so that the first N steps of the long epochs see the batches of the short
one. Horovod fuses gradients as they come, so at 3 ranks two runs of one Horovod script part in the last bits; with
fusion off (HOROVOD_FUSION_THRESHOLD=0) each run is reproducible, and the two comparisons can be held to the bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.rundir.names import CONFIG_FILE, MODEL_FILE, SUMMARY_FILE
from launched import compare_backends
from userscripts import write_folder

pytestmark = pytest.mark.timeout(900)

STEPS = 20
NP = 3
BATCH = 8
#: exactly STEPS steps of BATCH samples on each of NP ranks
SHORT_DATA = STEPS * BATCH * NP
#: every tensor reduced alone: Horovod's runs as reproducible as DDP's
REPRODUCIBLE_HOROVOD = {"HOROVOD_FUSION_THRESHOLD": "0"}
#: 1438 training samples: 60 steps per epoch at 3 ranks, 180 in all
LONG_ARGS = ["--epochs", "3", "--batch-size", str(BATCH)]

SAMPLES_FLAG = ("parser.add_argument('--seed', type=int, default=42, help='random seed (default: 42)')",
                "parser.add_argument('--seed', type=int, default=42, help='random seed (default: 42)')\n"
                "parser.add_argument('--samples', type=int, default=None, help='train on the first N samples')")
FIRST_SAMPLES = ("    train_dataset, test_dataset = build_datasets(seed=args.seed)\n",
                 "    train_dataset, test_dataset = build_datasets(seed=args.seed)\n"
                 "    if args.samples:\n"
                 "        train_dataset = torch.utils.data.Subset(train_dataset, range(args.samples))\n")
SCRIPTS = {
    "train_horovod.py": ("train_horovod.py", (SAMPLES_FLAG, FIRST_SAMPLES, (
        "train_dataset, num_replicas=hvd.size(), rank=hvd.rank())",
        "train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)"))),
    "train_ddp.py": ("train_ddp.py", (SAMPLES_FLAG, FIRST_SAMPLES, (
        "train_dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())",
        "train_dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=False)"))),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("user"), SCRIPTS)


def compared(folder: Path, name: str, *options: str, script_args: list) -> dict:
    """The pair compared at 3 ranks with the default controllers: the summary. No noise floor: its disturbed runs stop
    as the DDP run does, and the verdicts are made from the runs' records either way."""
    out = folder / name
    result = compare_backends("--scripts", "train_horovod.py", "train_ddp.py", "--np", str(NP), "--repeats", "1",
                              "--noise-floor", "off", *options, "--out", out, "--", *script_args,
                              env=REPRODUCIBLE_HOROVOD, cwd=folder)
    assert result.returncode == 0, result.output[-4000:]
    return json.loads((out / SUMMARY_FILE).read_text())


@pytest.fixture(scope="module")
def stopped(folder) -> dict:
    return compared(folder, "stopped", "--steps", str(STEPS), script_args=LONG_ARGS)


@pytest.fixture(scope="module")
def shortened(folder) -> dict:
    return compared(folder, "shortened", script_args=["--epochs", "1", "--batch-size", str(BATCH),
                                                      "--samples", str(SHORT_DATA)])


def runs_of(folder: Path, name: str) -> dict:
    """Each run directory of a comparison by its name: (config, summary)."""
    return {path.name: (json.loads((path / CONFIG_FILE).read_text()), json.loads((path / SUMMARY_FILE).read_text()))
            for path in sorted((folder / name / "runs").iterdir()) if (path / MODEL_FILE).exists()}


def test_every_run_ends_after_its_step_n_with_a_complete_run_directory(stopped, folder):
    runs = runs_of(folder, "stopped")
    backends = {summary["backend_options"]["name"] + "/" + str(summary["backend_options"]["controller"])
                for _, summary in runs.values()}
    assert backends == {"ddp/None", "horovod/gloo", "horovod/mpi"}, backends  # both default controllers ran
    assert not stopped["failures"], stopped["failures"]
    for name, (config, summary) in runs.items():
        assert summary["steps"] == STEPS, name
        assert config["config"]["max_steps"] == STEPS and config["script"]["argv"] == LONG_ARGS, name
        assert summary["weights_sha256"], name
    assert any(f"--steps {STEPS}" in note for note in stopped["notes"]), stopped["notes"]
    assert (folder / "stopped" / "report.md").read_text().count(f"(--steps {STEPS})") == 1  # said once, in the summary


def test_the_runs_and_verdicts_are_those_of_the_same_steps_made_by_shortening_the_data(stopped, shortened, folder):
    long, short = runs_of(folder, "stopped"), runs_of(folder, "shortened")
    assert sorted(long) == sorted(short)
    for name in long:
        assert long[name][1]["weights_sha256"] == short[name][1]["weights_sha256"], name

    def verdicts(summary: dict) -> list:
        return sorted((p["a"], p["b"], p["verdict"]) for p in summary["parity"])

    assert verdicts(stopped) == verdicts(shortened)
    assert any(p["kind"] == "backends" for p in stopped["parity"])


def test_steps_is_refused_where_the_projects_own_loop_runs(folder):
    result = compare_backends("--steps", "5", "--np", "1", "--out", folder / "refused", cwd=folder)
    assert result.returncode == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--max-steps 5" in lines[0], result.output
    assert not (folder / "refused").exists()
