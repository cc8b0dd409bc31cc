"""The comparison (`python -m common.compare`, `compare-backends`): plans and launches a matrix of runs
through the registered launchers, or reads `--runs`, then judges parity against the noise floor, speed and
scaling, names where and why two runs part, and writes `report.md` and `summary.json`. It reads runs only as
run directories, through `common.rundir`; may import `common.rundir`, `common.config`, `common.errors`,
`common.launch` and `common.doctor`, never the loop, a backend or the probe.
"""
