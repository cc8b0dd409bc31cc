"""What a run trains on and from what it starts: datasets and loaders (`data`), models adapted to the data
(`models`), users' factories named by import path (`factories`: `--dataset`/`--model` as
`package.module:function`), one trial step on a copy of the model before any collective (`modelcheck`), and
the initial weights moved by units in the last place (`perturb`: `--perturb-ulp`, `--perturb-pattern`), all
opened in one go before any collective (`opening`). May import `common.choices` (the built-in names its
registries are made from), `common.config` and `common.errors` only; never the loop, a backend, the run
directory or the comparison.
"""
