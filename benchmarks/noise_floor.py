"""The gap between DDP and Horovod against the noise floor, on a setting where rounding is amplified.

Runs `compare-backends` with DDP and Horovod (Gloo) at one world size, plus its noise-floor run (DDP again
with the initial weights moved by one ulp), and keeps what the verdict rests on: the parameters' and
buffers' largest per-tensor ‖Δ‖/‖w‖, the largest element-wise |Δw|, the per-step loss gap relative to
the loss, for the pair and for the floor. The default is ResNet-18 with Adam on 32x32 synthetic images,
where Adam turns rounding into whole steps of the learning rate (docs/comparing.md).

    python -m benchmarks.noise_floor                      # the default setting, 4 ranks
    python -m benchmarks.noise_floor --np 3 -- --model mlp --max-steps 6

Writes DIR/noise_floor.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from typing import Dict, Optional, Sequence

from common.compare import tables

from .jobs import add_places, job_env, run_cli
from .machine import REPO, Record, publish

#: the setting the verdicts are shown on (training options)
DEFAULT_TRAIN = ["--model", "resnet18", "--dataset", "synthetic", "--image-size", "32", "--optimizer", "adam",
                 "--lr", "0.001", "--weight-decay", "0.01", "--max-steps", "12", "--batch-size", "8", "--threads", "1"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.noise_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=4, help="world size (3 or more: at 2 the backends are bitwise equal)")
    p.add_argument("train", nargs="*", help="training options after -- (default: " + " ".join(DEFAULT_TRAIN) + ")")
    add_places(p, "runs/bench-noise-floor")
    return p


def _gap(entry: Dict) -> Dict:
    """What a pair or the floor measured, without the per-step series."""
    gaps = entry.get("gaps") or {}
    pick = {kind: {k: (gaps.get(kind) or {}).get(k) for k in ("max_rel", "max_abs", "largest")}
            for kind in ("parameters", "buffers") if gaps.get(kind)}
    return {"gap": entry["gap"], "tensors": pick, "max_rel_loss_diff": entry.get("max_rel_loss_diff"),
            "max_abs_weight_diff": entry.get("max_abs_weight_diff")}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.np < 3:
        print("noise_floor: error: --np must be 3 or more (at 1 and 2 ranks the backends are bitwise equal); "
              "try --np 4", file=sys.stderr)
        return 2
    record = Record("noise_floor", argv)
    train = args.train or DEFAULT_TRAIN
    shutil.rmtree(args.work, ignore_errors=True)
    command = [sys.executable, "-m", "common.compare", "--np", str(args.np), "--backends", "ddp,horovod",
               "--hvd-controllers", "gloo", "--repeats", "1", "--explain", "none", "--out", str(args.work), *train]
    print("noise_floor: " + " ".join(command[1:]), flush=True)
    done = subprocess.run(command, cwd=REPO, env=job_env())
    if done.returncode != 0 or not (args.work / "summary.json").is_file():
        print(f"noise_floor: error: compare-backends exited {done.returncode}; see {args.work}", file=sys.stderr)
        return 1
    summary = json.loads((args.work / "summary.json").read_text())
    (pair,) = [p for p in summary["parity"] if p["kind"] == "backends"]
    floor = summary["noise_floors"].get(str(args.np))
    report = {**record.header(), "settings": {"np": args.np, "train_args": train,
                                              "compare": "compare-backends " + " ".join(command[3:])},
              "pair": {"a": pair["a"], "b": pair["b"], "verdict": pair["verdict"], **_gap(pair),
                       "first_differing_step": pair["first_differing_step"], "floor_ratio": pair["floor_ratio"],
                       "within_noise_floor": pair["within_noise_floor"]},
              "floor": floor and {"base": floor["base"], "disturbed": floor["disturbed"], "ulp": floor["ulp"],
                                  **_gap(floor)},
              "floor_margin": summary["floor_margin"], "failures": summary["failures"]}
    rows = [[f"{pair['a']} vs {pair['b']}", tables.number(pair["gap"], ".2g"),
             tables.number(pair["max_abs_weight_diff"], ".3g"), tables.number(pair["max_rel_loss_diff"], ".2g")]]
    if floor:
        rows.append([f"{floor['base']} vs {floor['disturbed']} (floor)", tables.number(floor["gap"], ".2g"), "",
                     tables.number(floor["max_rel_loss_diff"], ".2g")])
    table = tables.text(["pair", "parameters ‖Δ‖/‖w‖", "max |Δw|", "max Δloss/loss"], rows) + f"\n{pair['verdict']}"
    return publish(report, args.out / "noise_floor.json", table)


if __name__ == "__main__":
    sys.exit(run_cli(main, "noise_floor"))
