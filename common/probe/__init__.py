"""The probe: follows a user's own training script, unmodified, and writes a run directory of it.
`python -m common.probe --run-dir DIR SCRIPT ARGS` runs SCRIPT as python would, under any launcher, with
hooks into torch (`hooks`) that record, per optimizer step and rank, what the comparison needs to find where
two scripts part and why (`recorder`); when the script ends rank 0 writes the run directory (`assemble`).
`session` ties them together on one rank. May import: `common.errors`, `common.launch.placement`,
the run directory (`common.rundir`), `common.inputs.perturb` and `common.checkpoints.format` (a script's
SHA-256); never the loop or a backend (it reads what the script initialised from torch and sys.modules).
"""
