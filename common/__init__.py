"""What both backends share, a package a concern: `loop` (the one training loop and its parts), `exact`,
`inputs`, `checkpoints`, `faults`, `rundir` (the run directory), `launch`, `compare`, `probe`; and `config`,
`entry` and `doctor`. docs/architecture.md draws which may import which; tests/test_architecture.py holds it.
"""
