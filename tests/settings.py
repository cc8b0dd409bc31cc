"""Training settings the tests share, so that tests asking for the same run share one launch (the
session's `runs` fixture)."""

from __future__ import annotations

from common import launch

# Two epochs at world size 2 and batch 32 are 46 steps; 30 crosses an epoch boundary.
COMMON = ["--dataset", "digits", "--batch-size", "32", "--epochs", "2", "--max-steps", "30", "--threads", "1"]
# TensorBoard files and the progress bar change nothing in the numbers; the logging tests read them.
MLP_SGD = COMMON + ["--model", "mlp", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--tensorboard",
                    "--progress", "on"]
ADAM_LR = 0.002
CONVNET_ADAM = COMMON + ["--model", "convnet", "--optimizer", "adam", "--lr", str(ADAM_LR), "--weight-decay", "0.01"]

#: make demo's training (every default), with the one thread per process it has at 3 ranks on two cores
DEMO = ["--threads", "1"]
# Every knob that keeps world-size-2 parity, at once; 23 batches per rank and epoch make 11 steps of
# --accumulate 2, so 16 steps cross an epoch boundary. Checkpoints every 5 steps, TensorBoard files and room for
# a third epoch change none of the numbers: these runs are test_knobs' and the first halves of test_checkpoint's
# stop and resume.
KNOBS = CONVNET_ADAM + ["--epochs", "3", "--max-steps", "16", "--channels-last", "--bucket-mb", "0.001",
                        "--clip-grad-norm", "0.05", "--accumulate", "2", "--amp", "bf16", "--profile", "3",
                        "--checkpoint-every", "5", "--tensorboard"]

#: the runs of the comparison across the two hosts of the simulated cluster (conftest.across_hosts)
ACROSS_HOSTS = ["--model", "mlp", "--threads", "1", "--max-steps", "10"]

#: the registered launchers that run training on this host without Slurm: alone (one process) or through a launcher
SINGLE = tuple(launcher.name for launcher in launch.host_launchers(single_process=True))
TWO_RANK = tuple(launcher.name for launcher in launch.host_launchers())
LAUNCHERS = SINGLE + TWO_RANK
#: launcher options of the shared runs: a user's own Open MPI choice, which hvd_train must keep
LAUNCHER_ARGS = {"mpirun": ("--mca", "mpi_yield_when_idle", "0")}


def processes(launcher: str) -> int:
    """How many processes the shared runs of a launcher start."""
    return 1 if launcher in SINGLE else 2


def mlp_run(runs, launcher: str):
    """The shared mlp / SGD run of a launcher."""
    return runs(launcher, processes(launcher), MLP_SGD, LAUNCHER_ARGS.get(launcher, ()))


def convnet_run(runs, launcher: str, np: int = 2):
    """The shared convnet / Adam + weight decay run of a launcher at `np` processes."""
    return runs(launcher, np, CONVNET_ADAM, LAUNCHER_ARGS.get(launcher, ()))
