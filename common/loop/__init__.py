"""The training loop and its parts: `trainer` (the one loop; `run(config, backend)`), the `backend` seam both
backends implement, this rank's `batches`, one data-parallel optimizer step (`stepping`), evaluation, meters
and clocks (`metrics`, `steptimer`), the learning rate (`optim`), `precision`, `profiling`, `progress`,
`finite` checks and the weights' `fingerprint`. May import `common.choices`, `common.config`, `common.errors`,
`common.launch`, `common.faults` and `common.inputs`; only `trainer`, the composition root that `common.entry`
alone imports, also imports `common.exact`, `common.checkpoints` and `common.rundir`. Never a backend,
`common.compare` or `common.probe`.
"""
