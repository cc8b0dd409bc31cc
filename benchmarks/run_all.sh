#!/usr/bin/env bash
# Refresh the benchmark results in benchmarks/results/ (JSON + PNG), then the comparison report with its
# benchmark section. Run on a quiet machine: anything else running disturbs the numbers (each JSON records
# the load average it started under, and each full step first waits, up to SETTLE_S seconds (300), for the
# load the previous step left to fall to an eighth of the cores). Then `python -m benchmarks.render`
# rebuilds BENCHMARKS.md from the new results.
#
#   benchmarks/run_all.sh                    # the full set (a few hours on 2 cores)
#   benchmarks/run_all.sh throughput.json exact_cost.json   # only the steps that write these results
#   benchmarks/run_all.sh $(python -m benchmarks.stale --names)   # only what is no longer current
#   QUICK=1 benchmarks/run_all.sh            # the same steps at tiny sizes: checks the pipeline in minutes
#
# A step is named by the result it writes, relative to OUT (`python -m benchmarks.stale` lists them and says
# which are stale: their script, the training or the set-up changed since the revision they record).
# OUT=DIR writes the results elsewhere (QUICK=1 defaults to runs/bench-quick, so that it never replaces
# the committed results), WORK=DIR is where QUICK=1 keeps its run directories, REPORT=0 skips the
# comparison report (it runs by default only with every step), PYTHON=... picks the interpreter.
# HOROVOD_SRC=DIR (runs/horovod) is a checkout of Horovod (git clone https://github.com/horovod/horovod) whose
# examples and test suite two steps run; without one they are skipped, saying so.
#
# Every file under benchmarks/results/ is written by one step below, and its JSON records the step's command;
# QUICK=1 writes the same files (tests/test_benchmarks.py checks both).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
QUICK=${QUICK:-0}
HOROVOD_SRC=${HOROVOD_SRC:-runs/horovod}
ONLY=("$@")
if [[ "$QUICK" == 1 ]]; then
  OUT=${OUT:-runs/bench-quick}
  WORK=${WORK:-runs/bench-quick/runs}
else
  OUT=${OUT:-benchmarks/results}
fi

# Tiny sizes, one launch per step, most of them of one rank: each step only has to run and write its
# file (between them they still start every launcher: torchrun, horovodrun --gloo and --mpi, mpirun).
# Timings mean nothing here, so two steps run at a time; a failed step fails the script.
quick_steps() {
  TINY=(--models convnet --image-size 8 --batch-size 4 --steps 3 --repeats 1)
  step -m benchmarks.allreduce --np 2 --backends torch --max-bytes 4K --iters 2 --warmup 1 --copy-bytes 1M \
      --out "$OUT"
  step -m benchmarks.horovod_cycle --np 1 --controllers gloo --cycle-ms 5 --idle-s 0.5 --matmuls 5 --out "$OUT"
  finish  # loop_overhead reads allreduce.json
  step -m benchmarks.loop_overhead --models convnet --image-size 8 --batch-size 4 --repeats 5 --out "$OUT"
  step -m benchmarks.ddp_comm_hook --np 1 --image-size 8 --batch-size 4 --blocks 1 --steps 3 --runs 1 --out "$OUT"
  step -m benchmarks.throughput --np 2 --backends ddp "${TINY[@]}" --steps convnet=3 --out "$OUT" \
      --work "$WORK/throughput" -- --threads 2
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
  # Two repeats: a sweep's values alternate, every other repeat backwards.
  step -m benchmarks.throughput --np 1 --backends horovod-gloo "${TINY[@]}" --repeats 2 --baselines none \
      --sweep deterministic=off,on --out "$OUT/deterministic" --work "$WORK/deterministic"
  step -m benchmarks.throughput --np 1 --backends horovod-gloo "${TINY[@]}" --baselines none \
      --sweep HVD_TRAIN_WAIT=spin,auto --out "$OUT/horovod-wait" --work "$WORK/horovod-wait"
  step -m benchmarks.exact_cost --np 1,2 --models convnet --global-batch 8 --micro-batch 4 --steps 2 --repeats 2 \
      --no-distance --out "$OUT" --work "$WORK/exact"
  step -m benchmarks.verdicts --quick --max-floor 2 --out "$OUT" --work "$WORK/verdicts"
  step -m benchmarks.verdicts --quick --cases lr+5% --max-floor 1 --out "$OUT/verdicts-precision" \
      --work "$WORK/verdicts-precision"
  step -m benchmarks.probe_cost --np 1 --cases convnet=8 --batch-size 4 --steps 3 --repeats 1 --out "$OUT" \
      --work "$WORK/probe_cost"
  finish  # stop_latency times its launches: alone (one launcher, one rank: tests/test_faults.py stops all four
  # with several ranks)
  step -m benchmarks.stop_latency --launchers torchrun --np 1 --model convnet --image-size 16 --batch-size 4 \
      --steps-before 1 --timeout 60 --out "$OUT" --work "$WORK/stop"
  finish
  step -m benchmarks.port_speed --lines 60 --repeats 1 --out "$OUT"
  step -m benchmarks.port_exit --runs 1 --endings port,no-end --out "$OUT"
  step -m benchmarks.engine_startup --engines spark,ray --np 2 --repeats 1 --out "$OUT"
  horovod_step -m benchmarks.link_speed --script "$HOROVOD_SRC/examples/pytorch/pytorch_synthetic_benchmark.py" \
      --links 1gbit --programs small-tensors --backends api,port --repeats 1 --batch-size 2 --steps 1 --out "$OUT"
  horovod_step -m benchmarks.link_speed --script "$HOROVOD_SRC/examples/pytorch/pytorch_synthetic_benchmark.py" \
      --links 1gbit --programs loop --loops ddp_train --repeats 1 --batch-size 2 --steps 1 \
      --out "$OUT/link-speed-targets"
  step -m benchmarks.negotiation --np 2,8 --tensors 16 --steps 2 --real-np 2 --real-steps 2 --out "$OUT"
  step -m benchmarks.horovod_api --script small-tensors --np 2 --backends api,port --repeats 1 --batch-size 2 \
      --warmup-batches 1 --batches-per-iter 1 --iters 1 --out "$OUT/small-tensors"
  step -m benchmarks.horovod_api --script small-tensors --np 8 --backends api,port --repeats 1 --batch-size 2 \
      --warmup-batches 1 --batches-per-iter 1 --iters 1 --out "$OUT/small-tensors-8"
  horovod_step -m benchmarks.horovod_api --script "$HOROVOD_SRC/examples/pytorch/pytorch_synthetic_benchmark.py" \
      --backends api --repeats 1 --batch-size 2 --warmup-batches 1 --batches-per-iter 1 --iters 1 --out "$OUT"
  horovod_step -m benchmarks.horovod_suite --horovod "$HOROVOD_SRC" --np 2 --runs api --no-examples \
      --work "$WORK/horovod_suite" --out "$OUT"
  finish
}

full_steps() {
  # Message sizes 4 B .. 256 MB by powers of 4, torch.distributed, both Horovod controllers and Open MPI
  # alone, against the memory-copy limit and the copy/add floor.
  step -m benchmarks.allreduce --np 2 --out "$OUT"
  # The loop's bookkeeping per step (reads the stop check's cost from allreduce.json).
  step -m benchmarks.loop_overhead --models convnet,resnet18 --repeats 300 --out "$OUT"
  # Horovod's background thread: idle CPU per cycle time and controller.
  step -m benchmarks.horovod_cycle --np 2 --cycle-ms 1,5,10,20 --idle-s 8 --out "$OUT"
  # DDP's built-in allreduce against the timing comm hook, three separate jobs.
  step -m benchmarks.ddp_comm_hook --np 2 --model convnet --image-size 32 --runs 3 --out "$OUT"
  # convnet 32x32 and resnet18 224x224, per-rank batch 16, one thread per rank, every backend, with both bare
  # DDP loops (seed-style and batched data path) and N independent processes as references: the loop and
  # exchange-overhead targets. convnet's steps take milliseconds: it takes more of them, so that each run times
  # seconds; four repeats, because identical runs on a shared machine differ by more than the targets' margins.
  step -m benchmarks.throughput --np 1,2 --models convnet,resnet18 --image-size convnet=32,resnet18=224 \
      --batch-size 16 --steps convnet=200,resnet18=12 --repeats 4 --backends ddp,horovod-gloo,horovod-mpi \
      --out "$OUT" -- --threads 1
  # Scaling at one thread per rank (the CPU analogue of one GPU per rank): the scaling target, with
  # Horovod's cycle time left to hvd_train (auto) and set by hand.
  step -m benchmarks.throughput --np 1,2 --models resnet18 --image-size 224 --batch-size 16 --steps 10 \
      --repeats 2 --backends ddp,horovod-gloo --baselines none --sweep HOROVOD_CYCLE_TIME=auto,1,5 \
      --out "$OUT/scaling-1thread" -- --threads 1
  # Horovod's cycle time against its scaling: resnet18 at 224x224 and at 32x32.
  step -m benchmarks.throughput --np 1,2 --models resnet18 --image-size 224 --batch-size 16 --steps 10 \
      --repeats 2 --backends horovod-gloo --baselines none --sweep HOROVOD_CYCLE_TIME=1,5,10,20 \
      --out "$OUT/horovod_cycle_scaling" -- --threads 1
  step -m benchmarks.throughput --np 2 --models resnet18 --image-size 32 --batch-size 16 --steps 40 \
      --repeats 3 --backends horovod-gloo --baselines none --sweep HOROVOD_CYCLE_TIME=1,5 \
      --out "$OUT/horovod_cycle_scaling_32" -- --threads 1
  # Data wait on the in-memory digits and on small synthetic images: the data-wait target.
  step -m benchmarks.throughput --np 1,2 --models convnet --dataset digits --batch-size 16 --steps 40 \
      --repeats 5 --baselines none --out "$OUT/data-wait-digits"
  step -m benchmarks.throughput --np 1,2 --models convnet --image-size 32 --batch-size 16 --steps 40 \
      --repeats 5 --baselines none --out "$OUT/data-wait-synthetic"
  # Open MPI alone against Horovod's MPI controller, 1 to 64 MB: where Horovod's MPI time goes.
  step -m benchmarks.allreduce --np 2 --backends mpi,horovod-mpi,torch,horovod-gloo --min-bytes 1M \
      --max-bytes 64M --out "$OUT/allreduce-64m"
  # Open MPI's allreduce algorithms at 64 MB, alone and under Horovod.
  step -m benchmarks.allreduce --np 2 --backends mpi,horovod-mpi --min-bytes 64M --max-bytes 64M --iters 10 \
      --mpi-algorithms default,ring,rabenseifner,recursive_doubling --out "$OUT/allreduce-mpi-algorithms"
  # Open MPI busy-polling or yielding under Horovod's MPI controller.
  step -m benchmarks.throughput --np 2 --models convnet,resnet18 --image-size 32 --batch-size 16 --steps 30 \
      --repeats 3 --backends horovod-mpi --baselines none --sweep OMPI_MCA_mpi_yield_when_idle=0,1 \
      --out "$OUT/mpi-yield"
  # What --deterministic (Horovod without tensor fusion) costs at three ranks.
  step -m benchmarks.throughput --np 3 --models convnet,resnet18 --image-size 32 --batch-size 16 --steps 30 \
      --repeats 3 --backends horovod-gloo --baselines none --sweep deterministic=off,on --out "$OUT/deterministic"
  # How a Horovod rank waits for its collectives on CPU: spinning as Horovod does, or polling (hvd_train's choice).
  step -m benchmarks.throughput --np 2,3 --models convnet,resnet18 --image-size 32 --batch-size 16 --steps 20 \
      --repeats 2 --backends horovod-gloo --baselines none --sweep HVD_TRAIN_WAIT=spin,auto \
      --out "$OUT/horovod-wait" -- --threads 1
  # --reduction exact against allreduce: speed, bytes, fixed-point error, distance after the default run.
  step -m benchmarks.exact_cost --np 2,3 --image-size resnet18=224 --steps 6 --repeats 4 --out "$OUT"
  # The verdicts on a corpus of same-training and real-difference pairs, against floors of 1 to 5 disturbed runs.
  step -m benchmarks.verdicts --out "$OUT"
  # The pairs computing in float16 / bfloat16 on both sides, and real differences under them (and two without).
  step -m benchmarks.verdicts --max-floor 3 --out "$OUT/verdicts-precision" \
      --cases fp16-both,fp16-both-mpi,bf16-both,momentum,weight-decay,fp16-lr+5%,fp16-weight-decay,fp16-momentum,bf16-clip
  # What the probe of compare-backends --scripts costs a user's DDP script: resnet18 224x224 and convnet 32x32.
  step -m benchmarks.probe_cost --np 2 --cases resnet18=224,convnet=32 --repeats 3 --out "$OUT"
  # Ctrl-C to exit, per launcher, with steps of seconds.
  step -m benchmarks.stop_latency --out "$OUT"
  # The port of a 300-line Horovod script.
  step -m benchmarks.port_speed --lines 300 --repeats 5 --out "$OUT"
  # How the processes of ported scripts end: each 50 times at 2 ranks, the port as written and without its end.
  step -m benchmarks.port_exit --runs 50 --np 2 --endings port,no-end --out "$OUT"
  # horovod.spark.run and RayExecutor on the Horovod API: from the call to the first step and to the result.
  step -m benchmarks.engine_startup --engines spark,ray --np 2,4 --repeats 3 --out "$OUT"
  # The Horovod API's negotiation per step, response cache on and off, simulated to 1024 ranks, real to 16.
  step -m benchmarks.negotiation --steps 3 --real-steps 12 --out "$OUT"
  # Horovod's own synthetic benchmark script and test suite on the project's Horovod API and on real Horovod.
  horovod_step -m benchmarks.horovod_api --script "$HOROVOD_SRC/examples/pytorch/pytorch_synthetic_benchmark.py" \
      --backends api,port,horovod-gloo,horovod-mpi --repeats 3 --out "$OUT"
  # (Horovod/Gloo is left out: one launch per test, as its controller cannot initialize twice, takes hours.)
  horovod_step -m benchmarks.horovod_suite --horovod "$HOROVOD_SRC" --np 2,3 --runs api,horovod-mpi --test-timeout 60 \
      --hang-grace 30 --out "$OUT"
  # Across the two simulated hosts (brought up for it, needs root), the link unshaped, at 10 and at 1 Gbit/s.
  horovod_step -m benchmarks.link_speed --script "$HOROVOD_SRC/examples/pytorch/pytorch_synthetic_benchmark.py" \
      --repeats 2 --out "$OUT"
  # The cells the targets read (the API against its port, the loops against theirs), in longer runs.
  horovod_step -m benchmarks.link_speed --script "$HOROVOD_SRC/examples/pytorch/pytorch_synthetic_benchmark.py" \
      --programs synthetic,loop --backends api,port,horovod-gloo --steps 10 --repeats 3 --no-probe \
      --out "$OUT/link-speed-targets"
  # A Horovod script of many small gradient tensors: the API (cache on and off), its DDP port, Horovod/Gloo, at 2
  # and at 8 ranks (100 steps a run).
  step -m benchmarks.horovod_api --script small-tensors --np 2 --backends api,api-cache-off,port,horovod-gloo \
      --repeats 5 --warmup-batches 10 --batches-per-iter 20 --out "$OUT/small-tensors"
  step -m benchmarks.horovod_api --script small-tensors --np 8 --backends api,api-cache-off,port,horovod-gloo \
      --repeats 3 --warmup-batches 10 --batches-per-iter 20 --out "$OUT/small-tensors-8"
}

# The result a step writes, relative to OUT: its --out folder and its module's file name.
result_of() {
  local word prev="" module="" out=""
  for word in "$@"; do
    [[ "$prev" == -m ]] && module=${word#benchmarks.}
    [[ "$prev" == --out ]] && out=${word#"$OUT"}
    prev=$word
  done
  out=${out#/}
  echo "${out:+$out/}$module.json"
}

wanted() {
  (( ${#ONLY[@]} == 0 )) && return 0
  local name
  for name in "${ONLY[@]}"; do [[ "$name" == "$1" ]] && return 0; done
  return 1
}

# A step: `python ARGS`, unless other steps were named. The first pass only lists the steps.
PASS=list
STEPS=()
running=()
step() {
  local name
  name=$(result_of "$@")
  if [[ "$PASS" == list ]]; then STEPS+=("$name"); return 0; fi
  wanted "$name" || return 0
  if [[ "$QUICK" == 1 ]]; then
    # Two steps at once (each job gets an Open MPI session directory of its own: common.launch.jobs.Job).
    "$PY" "$@" &
    running+=($!)
    if (( ${#running[@]} >= 2 )); then wait "${running[0]}"; running=("${running[@]:1}"); fi
  else
    "$PY" -m benchmarks.settle --max-s "${SETTLE_S:-300}"
    echo "benchmarks: $name"
    "$PY" "$@"
  fi
}
# A step that reads the Horovod checkout: skipped, saying so, when there is none.
horovod_step() {
  if [[ "$PASS" == run && ! -d "$HOROVOD_SRC/examples" ]]; then
    wanted "$(result_of "$@")" && echo "benchmarks: skipped $(result_of "$@"): no Horovod checkout at $HOROVOD_SRC" >&2
    return 0
  fi
  step "$@"
}
finish() {
  local pid
  for pid in "${running[@]}"; do wait "$pid"; done
  running=()
}

if [[ "$QUICK" == 1 ]]; then steps=quick_steps; else steps=full_steps; fi
"$steps"
for name in "${ONLY[@]}"; do
  if ! printf '%s\n' "${STEPS[@]}" | grep -qxF -- "$name"; then
    echo "benchmarks/run_all.sh: error: no step writes $name; name steps by their results: ${STEPS[*]}" >&2
    exit 2
  fi
done
PASS=run
mkdir -p "$OUT"
"$steps"
finish

if [[ "${REPORT:-$(( ${#ONLY[@]} == 0 ))}" != 0 ]]; then
  # The comparison report on the embedded default, with the benchmark section added.
  "$PY" -m common.compare --repeats 1 --out runs/compare --bench "$OUT"
  echo "benchmarks: results in $OUT, report in runs/compare/report.md"
else
  echo "benchmarks: results in $OUT"
fi
