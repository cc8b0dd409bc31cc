#!/usr/bin/env bash
# Refresh every benchmark result in benchmarks/results/ (JSON + PNG), then the comparison report
# with its benchmark section. Run on a quiet machine: anything else running disturbs the numbers
# (each JSON records the load average it started under).
#
#   benchmarks/run_all.sh            # the full set (a few hours on 2 cores)
#   QUICK=1 benchmarks/run_all.sh    # small sizes, one repeat: checks the pipeline in minutes
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"

if [[ "${QUICK:-0}" == 1 ]]; then
  "$PY" -m benchmarks.allreduce --np 2 --max-bytes 4M --iters 5 --out "$OUT"
  "$PY" -m benchmarks.loop_overhead --models convnet --out "$OUT"
  "$PY" -m benchmarks.horovod_cycle --np 2 --cycle-ms 1,5 --idle-s 3 --out "$OUT"
  "$PY" -m benchmarks.throughput --np 1,2 --models convnet --image-size 32 --steps 6 --repeats 1 --out "$OUT"
else
  # Message sizes 4 B .. 256 MB by powers of 4, torch.distributed and both Horovod controllers.
  "$PY" -m benchmarks.allreduce --np 2,4 --out "$OUT"
  # The loop's bookkeeping per step (reads the stop check's cost from allreduce.json).
  "$PY" -m benchmarks.loop_overhead --models convnet,resnet18 --out "$OUT"
  # Horovod's background thread: idle CPU per cycle time and controller.
  "$PY" -m benchmarks.horovod_cycle --np 2 --cycle-ms 1,5,10,20 --idle-s 8 --out "$OUT"
  # convnet 32x32 and resnet18 224x224, per-rank batch 16, every world size, 3 repeats,
  # with the bare DDP loop and N independent processes as references.
  "$PY" -m benchmarks.throughput --np 1,2,4 --models convnet,resnet18 \
      --image-size convnet=32,resnet18=224 --batch-size 16 --steps 12 --repeats 3 \
      --backends ddp,horovod-gloo,horovod-mpi --out "$OUT"
  # Scaling at one thread per rank (the CPU analogue of one GPU per rank): the scaling target.
  "$PY" -m benchmarks.throughput --np 1,2 --models resnet18 --image-size 224 --batch-size 16 --steps 10 \
      --repeats 2 --backends ddp,horovod-gloo --baselines none --sweep HOROVOD_CYCLE_TIME=1,5 \
      --out "$OUT/scaling-1thread" -- --threads 1
  # Horovod's cycle time against its scaling: resnet18 at 224x224 and at 32x32.
  "$PY" -m benchmarks.throughput --np 1,2 --models resnet18 --image-size 224 --batch-size 16 --steps 10 \
      --repeats 2 --backends horovod-gloo --baselines none --sweep HOROVOD_CYCLE_TIME=1,5,10,20 \
      --out "$OUT/horovod_cycle_scaling" -- --threads 1
  "$PY" -m benchmarks.throughput --np 2 --models resnet18 --image-size 32 --batch-size 16 --steps 40 \
      --repeats 3 --backends horovod-gloo --baselines none --sweep HOROVOD_CYCLE_TIME=1,5 \
      --out "$OUT/horovod_cycle_scaling_32" -- --threads 1
  # Data wait on the in-memory digits and on small synthetic images: the data-wait target.
  "$PY" -m benchmarks.throughput --np 1,2 --models convnet --dataset digits --batch-size 16 --steps 40 \
      --repeats 5 --baselines none --out "$OUT/data-wait-digits"
  "$PY" -m benchmarks.throughput --np 1,2 --models convnet --image-size 32 --batch-size 16 --steps 40 \
      --repeats 5 --baselines none --out "$OUT/data-wait-synthetic"
  # Open MPI alone against Horovod's MPI controller, 1 to 64 MB: where Horovod's MPI time goes.
  "$PY" -m benchmarks.allreduce --np 2 --backends mpi,horovod-mpi,torch,horovod-gloo --min-bytes 1M \
      --max-bytes 64M --out "$OUT/allreduce-64m"
  # Open MPI busy-polling or yielding under Horovod's MPI controller.
  "$PY" -m benchmarks.throughput --np 2 --models convnet,resnet18 --image-size 32 --batch-size 16 --steps 30 \
      --repeats 3 --backends horovod-mpi --baselines none --sweep OMPI_MCA_mpi_yield_when_idle=0,1 \
      --out "$OUT/mpi-yield"
fi

# The comparison report on the embedded default, with the benchmark section added.
"$PY" -m common.compare --repeats 1 --out runs/compare --bench "$OUT"
echo "benchmarks: results in $OUT, report in runs/compare/report.md"
