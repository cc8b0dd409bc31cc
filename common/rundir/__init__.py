"""The run directory, the contract between training and the comparison: what its files are called (`names`),
writing them on rank 0 (`writer`: `RunDir`, `weights_sha256`; `tensorboard`: TensorBoard's event files from
the same events), what `config.json` and `summary.json` say about a run (`records`), and reading them back
(`reader`: `Run`, `read_run`, `read_files`, `events_so_far`, and whether runs compare). Every other part of
the project reads and writes run directories through this package; the file names appear nowhere else. `names`
and `reader` import nothing of the project outside `names`, so the comparison can read runs without the training side;
`writer` may also import `common.checkpoints.format`, and `records` the settings and the loop's parts it
describes (`common.config`, `common.launch`, `common.inputs`, `common.loop`). Never a backend, the comparison
or the probe.
"""
