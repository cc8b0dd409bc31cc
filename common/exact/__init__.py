"""`--reduction exact`: gradients summed as fixed-point integers (`fixedpoint`), so that their sum has the same
bits in any order and at any world size; the optimizer step that uses them (`step`, `ExactStep`); BatchNorm
running statistics folded in global micro-batch order (`shardstats`). `fixedpoint` and `shardstats` import
nothing of the project; `step` may import `common.config` and the loop's parts it shares with the
data-parallel step (`common.loop.backend`, `batches`, `finite`, `metrics`, `precision`), never
`common.loop.trainer`, a backend, or the comparison.
"""
