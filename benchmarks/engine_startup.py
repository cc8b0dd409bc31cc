"""How long a Horovod driver on Spark or Ray waits, on the Horovod API, from its call to the first training step and to
the result: `horovod.spark.run` on a local Spark (`local[N]`, TorchDistributor's local mode) and
`horovod.ray.RayExecutor` on a local Ray (`ray.init(num_cpus=N)`), N workers.

Each repeat is a driver of its own (`python -m ddp_train.horovod_api driver.py`), which starts its engine, then calls
twice: `horovod.spark.run(train, num_proc=N)` twice (each call starts its workers again), or `executor.start()` and
`executor.run(train)`, then `executor.run(train)` again (the actors stay). `train` joins the group (hvd.init), takes 5
SGD steps of a small linear model through DistributedOptimizer, and returns the wall-clock times it entered and ended
its first step; the driver's clock is the same (one host).

    python -m benchmarks.engine_startup --engines spark,ray --np 2,4 --repeats 3 --out benchmarks/results

Writes DIR/engine_startup.json and prints a table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Sequence

from common.errors import print_error

from .jobs import add_np, add_out, add_timeout, parser, refuse, run_cli
from .machine import REPO, Record

ENGINES = ("spark", "ray")
DEFINITIONS = {"engine_start_s": "seconds to start the engine in the driver (SparkSession, or ray.init)",
               "to_fn_s": "seconds from the call to the last rank entering the function",
               "to_first_step_s": "seconds from the call to the last rank ending its first step",
               "to_result_s": "seconds from the call to the driver holding every rank's result",
               "call": "1: the first call (Ray: from executor.start()); 2: the next call (Ray's actors stay)"}

DRIVER = '''
import json
import sys
import time


def train(steps):
    import time

    entered = time.time()
    import torch
    import horovod.torch as hvd

    hvd.init()
    model = torch.nn.Linear(32, 4)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    first = None
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(16, 32)).pow(2).mean().backward()
        optimizer.step()
        first = first or time.time()
    return {"rank": hvd.rank(), "entered": entered, "first_step": first}


def row(call, started, results, ended, engine_start_s):
    ranks = [r["rank"] for r in results]
    assert ranks == list(range(len(ranks))), ranks
    print("RESULT " + json.dumps({"call": call, "engine_start_s": engine_start_s,
                                  "to_fn_s": max(r["entered"] for r in results) - started,
                                  "to_first_step_s": max(r["first_step"] for r in results) - started,
                                  "to_result_s": ended - started}), flush=True)


if __name__ == "__main__":
    engine, n = sys.argv[1], int(sys.argv[2])
    begun = time.time()
    if engine == "spark":
        from pyspark.sql import SparkSession

        import horovod.spark

        spark = SparkSession.builder.master(f"local[{n}]").getOrCreate()
        engine_start_s = time.time() - begun
        for call in (1, 2):
            started = time.time()
            results = horovod.spark.run(train, args=(5,), num_proc=n)
            row(call, started, results, time.time(), engine_start_s)
        spark.stop()
    else:
        import ray
        from horovod.ray import RayExecutor

        ray.init(num_cpus=n, include_dashboard=False)
        engine_start_s = time.time() - begun
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=n, cpus_per_worker=1)
        started = time.time()
        executor.start()
        results = executor.run(train, args=[5])
        row(1, started, results, time.time(), engine_start_s)
        started = time.time()
        results = executor.run(train, args=[5])
        row(2, started, results, time.time(), engine_start_s)
        executor.shutdown()
        ray.shutdown()
'''


def measure(driver: Path, engine: str, n: int, timeout_s: float) -> List[Dict[str, Any]]:
    """The rows of one driver run (one a call)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "RAY_agent_register_timeout_ms": "180000", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "ddp_train.horovod_api", str(driver), engine, str(n)],
                          capture_output=True, text=True, timeout=timeout_s, cwd=driver.parent, env=env)
    rows = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or len(rows) != 2:
        raise RuntimeError(f"the {engine} driver with {n} workers exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-800:]}")
    return [{"engine": engine, "workers": n, **r} for r in rows]


def medians(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per engine, workers and call: the median of each figure over the repeats."""
    keys = sorted({(r["engine"], r["workers"], r["call"]) for r in rows},
                  key=lambda k: (ENGINES.index(k[0]), k[1], k[2]))
    out = []
    for engine, n, call in keys:
        mine = [r for r in rows if (r["engine"], r["workers"], r["call"]) == (engine, n, call)]
        out.append({"engine": engine, "workers": n, "call": call, "repeats": len(mine),
                    **{f: statistics.median(r[f] for r in mine)
                       for f in ("engine_start_s", "to_fn_s", "to_first_step_s", "to_result_s")}})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Measure; 1 when a driver failed (the rest is written), 2 on bad input."""
    p = parser("engine_startup", __doc__)
    p.add_argument("--engines", default="spark,ray", help="spark, ray, or both (comma-separated)")
    add_np(p, [2, 4], help="the numbers of workers to measure (2,4)")
    p.add_argument("--repeats", type=int, default=3, help="driver runs of each engine and number of workers")
    add_timeout(p, 600, help="seconds before one driver run is stopped")
    add_out(p)
    args = p.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    if not engines or any(e not in ENGINES for e in engines) or args.repeats < 1:
        return refuse("engine_startup", f"--engines takes {' and '.join(ENGINES)} (comma-separated), --repeats >= 1; "
                      f"got --engines {args.engines} --repeats {args.repeats}")
    record = Record("engine_startup", argv)
    rows: List[Dict[str, Any]] = []
    failures: List[Dict[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="engine_startup-") as work:
        driver = Path(work) / "driver.py"
        driver.write_text(DRIVER)
        for repeat in range(args.repeats):
            for engine in engines:
                for n in args.np:
                    try:
                        rows += [{**r, "repeat": repeat} for r in measure(driver, engine, n, args.timeout)]
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        print_error("engine_startup", str(exc).splitlines()[0], ranked=False)
                        failures.append({"case": f"{engine}, {n} workers, repeat {repeat}", "error": str(exc)})
    return record.publish(args.out, settings={"engines": engines, "np": args.np, "repeats": args.repeats},
                          definitions=DEFINITIONS, runs=rows, rows=medians(rows), failures=failures)


if __name__ == "__main__":
    sys.exit(run_cli(main, "engine_startup"))
