"""Checkpoints: the file format (`format`: atomic save with a SHA-256, verified `weights_only` load, pruning,
refusals) and what a run does with them (`during_run`: which checkpoint to resume from, when one is due, what
it holds of the run's training and where that goes back, writing one while every rank waits), and resuming at
another world size (`resume`: what carries over, how the rest of the run is counted). `format` imports nothing
of the project, so the run directory, the probe, Horovod's elastic state and the tests can use it alone;
`during_run` and `resume` may also import the loop's parts and `common.config`. Never the trainer, a backend or
the comparison.
"""
