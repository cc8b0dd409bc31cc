#!/usr/bin/env bash
# Refresh every benchmark result in benchmarks/results/ (JSON + PNG), then the comparison report
# with its benchmark section. Run on a quiet machine: anything else running disturbs the numbers
# (each JSON records the load average it started under). Then `python -m benchmarks.render`
# rebuilds BENCHMARKS.md from the new results.
#
#   benchmarks/run_all.sh                    # the full set (a few hours on 2 cores)
#   QUICK=1 benchmarks/run_all.sh            # the same steps at tiny sizes: checks the pipeline in minutes
#
# OUT=DIR writes the results elsewhere (QUICK=1 defaults to runs/bench-quick, so that it never replaces
# the committed results), WORK=DIR is where QUICK=1 keeps its run directories, REPORT=0 skips the
# comparison report, PYTHON=... picks the interpreter.
#
# Every file under benchmarks/results/ is written by one step below, and its JSON records the step's command;
# QUICK=1 writes the same files (tests/test_benchmarks.py checks both).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}

if [[ "${QUICK:-0}" == 1 ]]; then
  OUT=${OUT:-runs/bench-quick}
  WORK=${WORK:-runs/bench-quick/runs}
  mkdir -p "$OUT"
  # Tiny sizes, one launch per step, most of them of one rank: each step only has to run and write its
  # file (between them they still start every launcher: torchrun, horovodrun --gloo and --mpi, mpirun).
  # Timings mean nothing here, so two steps run at a time; a failed step fails the script.
  running=()
  step() {
    "$PY" "$@" &
    running+=($!)
    if (( ${#running[@]} >= 2 )); then wait "${running[0]}"; running=("${running[@]:1}"); fi
  }
  finish() {
    for pid in "${running[@]}"; do wait "$pid"; done
    running=()
  }
  TINY=(--models convnet --image-size 8 --batch-size 4 --steps 3 --repeats 1)
  step -m benchmarks.allreduce --np 2 --backends torch --max-bytes 4K --iters 2 --warmup 1 --copy-bytes 1M \
      --out "$OUT"
  step -m benchmarks.horovod_cycle --np 1 --controllers gloo --cycle-ms 5 --idle-s 0.5 --matmuls 5 --out "$OUT"
  finish  # loop_overhead reads allreduce.json
  step -m benchmarks.loop_overhead --models convnet --image-size 8 --batch-size 4 --repeats 5 --out "$OUT"
  step -m benchmarks.ddp_comm_hook --np 1 --image-size 8 --batch-size 4 --blocks 1 --steps 3 --runs 1 --out "$OUT"
  step -m benchmarks.throughput --np 2 --backends ddp "${TINY[@]}" --out "$OUT" --work "$WORK/throughput" \
      -- --threads 2
  step -m benchmarks.throughput --np 1 --backends horovod-gloo "${TINY[@]}" --baselines none \
      --sweep HOROVOD_CYCLE_TIME=auto,5 --out "$OUT/scaling-1thread" --work "$WORK/scaling-1thread" -- --threads 1
  step -m benchmarks.throughput --np 1 --backends horovod-gloo "${TINY[@]}" --baselines none \
      --out "$OUT/horovod_cycle_scaling" --work "$WORK/horovod_cycle_scaling"
  step -m benchmarks.throughput --np 1 --backends horovod-gloo "${TINY[@]}" --baselines none \
      --out "$OUT/horovod_cycle_scaling_32" --work "$WORK/horovod_cycle_scaling_32"
  step -m benchmarks.throughput --np 1 --backends ddp --models convnet --dataset digits --batch-size 8 --steps 3 \
      --repeats 1 --baselines none --out "$OUT/data-wait-digits" --work "$WORK/data-wait-digits"
  step -m benchmarks.throughput --np 1 --backends ddp "${TINY[@]}" --baselines none \
      --out "$OUT/data-wait-synthetic" --work "$WORK/data-wait-synthetic"
  step -m benchmarks.allreduce --np 2 --backends mpi --min-bytes 1K --max-bytes 4K --iters 2 --warmup 1 \
      --copy-bytes 1M --out "$OUT/allreduce-64m"
  step -m benchmarks.allreduce --np 2 --backends horovod-mpi --min-bytes 4K --max-bytes 4K --iters 2 --warmup 1 \
      --copy-bytes 1M --mpi-algorithms ring --out "$OUT/allreduce-mpi-algorithms"
  step -m benchmarks.throughput --np 1 --backends horovod-mpi "${TINY[@]}" --baselines none \
      --out "$OUT/mpi-yield" --work "$WORK/mpi-yield"
  step -m benchmarks.throughput --np 1 --backends horovod-gloo "${TINY[@]}" --baselines none \
      --sweep deterministic=off,on --out "$OUT/deterministic" --work "$WORK/deterministic"
  step -m benchmarks.throughput --np 1 --backends horovod-gloo "${TINY[@]}" --baselines none \
      --sweep HVD_TRAIN_WAIT=spin,auto --out "$OUT/horovod-wait" --work "$WORK/horovod-wait"
  step -m benchmarks.exact_cost --np 1,2 --models convnet --global-batch 8 --micro-batch 4 --steps 2 --repeats 1 \
      --no-distance --out "$OUT" --work "$WORK/exact"
  step -m benchmarks.verdicts --quick --max-floor 2 --out "$OUT" --work "$WORK/verdicts"
  step -m benchmarks.probe_cost --np 1 --cases convnet=8 --batch-size 4 --steps 3 --repeats 1 --out "$OUT" \
      --work "$WORK/probe_cost"
  finish  # stop_latency times its launches: alone (one launcher, one rank: tests/test_faults.py stops all four
  # with several ranks)
  step -m benchmarks.stop_latency --launchers torchrun --np 1 --model convnet --image-size 16 --batch-size 4 \
      --steps-before 1 --timeout 60 --out "$OUT" --work "$WORK/stop"
  finish
else
  OUT=${OUT:-benchmarks/results}
  mkdir -p "$OUT"
  # Message sizes 4 B .. 256 MB by powers of 4, torch.distributed, both Horovod controllers and Open MPI
  # alone, against the memory-copy limit and the copy/add floor.
  "$PY" -m benchmarks.allreduce --np 2 --out "$OUT"
  # The loop's bookkeeping per step (reads the stop check's cost from allreduce.json).
  "$PY" -m benchmarks.loop_overhead --models convnet,resnet18 --repeats 300 --out "$OUT"
  # Horovod's background thread: idle CPU per cycle time and controller.
  "$PY" -m benchmarks.horovod_cycle --np 2 --cycle-ms 1,5,10,20 --idle-s 8 --out "$OUT"
  # DDP's built-in allreduce against the timing comm hook, three separate jobs.
  "$PY" -m benchmarks.ddp_comm_hook --np 2 --model convnet --image-size 32 --runs 3 --out "$OUT"
  # convnet 32x32 and resnet18 224x224, per-rank batch 16, one thread per rank, every backend, with both bare
  # DDP loops (seed-style and batched data path) and N independent processes as references: the loop and
  # exchange-overhead targets.
  "$PY" -m benchmarks.throughput --np 1,2 --models convnet,resnet18 --image-size convnet=32,resnet18=224 \
      --batch-size 16 --steps 12 --repeats 2 --backends ddp,horovod-gloo,horovod-mpi --out "$OUT" -- --threads 1
  # Scaling at one thread per rank (the CPU analogue of one GPU per rank): the scaling target, with
  # Horovod's cycle time left to hvd_train (auto) and set by hand.
  "$PY" -m benchmarks.throughput --np 1,2 --models resnet18 --image-size 224 --batch-size 16 --steps 10 \
      --repeats 2 --backends ddp,horovod-gloo --baselines none --sweep HOROVOD_CYCLE_TIME=auto,1,5 \
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
  # Open MPI's allreduce algorithms at 64 MB, alone and under Horovod.
  "$PY" -m benchmarks.allreduce --np 2 --backends mpi,horovod-mpi --min-bytes 64M --max-bytes 64M --iters 10 \
      --mpi-algorithms default,ring,rabenseifner,recursive_doubling --out "$OUT/allreduce-mpi-algorithms"
  # Open MPI busy-polling or yielding under Horovod's MPI controller.
  "$PY" -m benchmarks.throughput --np 2 --models convnet,resnet18 --image-size 32 --batch-size 16 --steps 30 \
      --repeats 3 --backends horovod-mpi --baselines none --sweep OMPI_MCA_mpi_yield_when_idle=0,1 \
      --out "$OUT/mpi-yield"
  # What --deterministic (Horovod without tensor fusion) costs at three ranks.
  "$PY" -m benchmarks.throughput --np 3 --models convnet,resnet18 --image-size 32 --batch-size 16 --steps 30 \
      --repeats 3 --backends horovod-gloo --baselines none --sweep deterministic=off,on --out "$OUT/deterministic"
  # How a Horovod rank waits for its collectives on CPU: spinning as Horovod does, or polling (hvd_train's choice).
  "$PY" -m benchmarks.throughput --np 2,3 --models convnet,resnet18 --image-size 32 --batch-size 16 --steps 20 \
      --repeats 2 --backends horovod-gloo --baselines none --sweep HVD_TRAIN_WAIT=spin,auto \
      --out "$OUT/horovod-wait" -- --threads 1
  # --reduction exact against allreduce: speed, bytes, fixed-point error, distance after the default run.
  "$PY" -m benchmarks.exact_cost --np 2,3 --image-size resnet18=224 --steps 6 --out "$OUT"
  # The verdicts on a corpus of same-training and real-difference pairs, against floors of 1 to 5 disturbed runs.
  "$PY" -m benchmarks.verdicts --out "$OUT"
  # What the probe of compare-backends --scripts costs a user's DDP script: resnet18 224x224 and convnet 32x32.
  "$PY" -m benchmarks.probe_cost --np 2 --cases resnet18=224,convnet=32 --repeats 3 --out "$OUT"
  # Ctrl-C to exit, per launcher, with steps of seconds.
  "$PY" -m benchmarks.stop_latency --out "$OUT"
fi

if [[ "${REPORT:-1}" != 0 ]]; then
  # The comparison report on the embedded default, with the benchmark section added.
  "$PY" -m common.compare --repeats 1 --out runs/compare --bench "$OUT"
  echo "benchmarks: results in $OUT, report in runs/compare/report.md"
else
  echo "benchmarks: results in $OUT"
fi
