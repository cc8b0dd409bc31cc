"""Checkpoints: the file format (`format`: atomic save with a SHA-256, verified `weights_only` load, pruning,
refusals) and what a run does with them (`during_run`: which checkpoint to resume from, writing one while
every rank waits). `format` imports nothing of the project, so the run directory, the probe, Horovod's elastic
state and the tests can use it alone; `during_run` may also import `common.loop.backend`. Never a backend or
the comparison.
"""
