"""The GPU check's steps, run by scripts/gpu_check.sh (docs/gpu-check.md is the manual).

Python's standard library only: it starts before the project is installed, with the machine's own python3. Each
step runs its commands in a process group of their own under a time box, and is recorded in one JSON file with
its outcome (ok, failed, timeout, skipped), its time, what it measured and, where it failed, the error line.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
PROG = "gpu_check"
HOROVOD_VERSION = "0.28.1"
#: the steps in the order they run (the Horovod build runs beside the API and the exact runs: see run_all)
STEPS = ["install", "ddp", "amp_fp16", "amp_bf16", "channels_last", "exact", "horovod_api", "horovod_build",
         "compare"]
#: the issue's numbering of the steps (docs/gpu-check.md)
ISSUE_STEP = {"install": 0, "ddp": 1, "amp_fp16": 2, "amp_bf16": 2, "channels_last": 2, "exact": 3,
              "horovod_api": 4, "horovod_build": 5, "compare": 6}
#: seconds each step may take at most, on a GPU machine and in the CPU rehearsal
BOX = {"cuda": {"install": 90, "ddp": 90, "amp_fp16": 60, "amp_bf16": 60, "channels_last": 60, "exact": 150,
                "horovod_api": 75, "horovod_build": 240, "compare": 150},
       "cpu": {"install": 120, "ddp": 120, "amp_fp16": 90, "amp_bf16": 90, "channels_last": 90, "exact": 240,
               "horovod_api": 120, "horovod_build": 900, "compare": 300}}
#: seconds kept back for each later step, so that an early step cannot take a later one's time
RESERVE = {"cuda": {"install": 20, "ddp": 25, "amp_fp16": 20, "amp_bf16": 20, "channels_last": 20, "exact": 45,
                    "horovod_api": 25, "horovod_build": 0, "compare": 45},
           "cpu": {"install": 10, "ddp": 15, "amp_fp16": 0, "amp_bf16": 15, "channels_last": 15, "exact": 40,
                   "horovod_api": 15, "horovod_build": 0, "compare": 30}}
#: the whole check, seconds (GPU_CHECK_BUDGET)
BUDGET = {"cuda": 480, "cpu": 300}
#: the training of every run: resnet18 on synthetic 224x224 images on a GPU, a set small enough to be generated once
#: and kept (common.inputs.data.SYNTHETIC_KEEP_BYTES: 128 MB), since generating a batch on access takes longer than
#: a GPU's step; a tiny ConvNet in the CPU rehearsal
TRAIN = {"cuda": {"--model": "resnet18", "--dataset": "synthetic", "--image-size": "224", "--synthetic-samples": "212",
                  "--epochs": "1000", "--eval-every": "1000", "--max-steps": "40"},
         "cpu": {"--model": "convnet", "--dataset": "synthetic", "--image-size": "8", "--synthetic-samples": "256",
                 "--batch-size": "8", "--epochs": "100", "--max-steps": "4", "--threads": "1"}}
#: on a GPU, samples per rank and step: 32, fewer where the 169 training samples of the kept set would not make
#: 2 steps an epoch
GPU_BATCH, KEPT_TRAIN_SAMPLES = 32, 169
#: --reduction exact: samples per micro-batch and steps (the global batch is 2 micro-batches per rank)
EXACT = {"cuda": {"micro_batch": 8, "max_steps": 20}, "cpu": {"micro_batch": 4, "max_steps": 4}}
#: the Horovod-style script of step 4 and its arguments
HVD_SCRIPT = "examples/gpu/train_horovod.py"
HVD_ARGS = {"cuda": ["--model", "resnet18", "--batch-size", "64", "--num-iters", "5"],
            "cpu": ["--model", "resnet18", "--batch-size", "2", "--image-size", "32", "--num-warmup-batches", "1",
                    "--num-batches-per-iter", "1", "--num-iters", "2", "--no-cuda"]}
#: what GPU_CHECK_FAIL adds to a step's training command: an option every program of the project refuses
FORCED_FAILURE = "--gpu-check-forced-failure"
#: an error line: Python's exceptions, `error:` of pip, CMake and compilers; and the lines that only say that
#: another line said why
ERROR_LINE = re.compile(r"(^|\s)([\w.]*(Error|Exception)|[Ee]rror|ERROR):\s")
NOT_THE_REASON = ("subprocess-exited-with-error", "metadata-generation-failed", "ChildFailedError",
                  "See above for", "note: This error originates")
#: where a CUDA toolkit may be, after $CUDA_HOME and before the one of the nvcc on PATH (which may be a wrapper
#: script outside the toolkit)
CUDA_ROOTS = [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
BANNER = re.compile(r"\[ddp\] rank (\d+)/(\d+) local_rank (\d+)/(\d+) host (\S+) device (\S+)")
NCCL_VERSION = re.compile(r"NCCL version (\S+)")


def refuse(message: str) -> None:
    """A setting the check cannot run with: one line, exit code 2."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def now() -> float:
    return time.monotonic()


def one_line(text: str, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def error_line(output: str) -> Optional[str]:
    """The line that says why a command failed: the last error line of the project's programs (`PROG: error: ...`),
    else the last other error line (an exception, pip's, CMake's, a compiler's), else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ours = [line for line in lines if ": error: " in line]
    if ours:
        return one_line(ours[-1])
    errors = [line for line in lines if ERROR_LINE.search(line) and not any(s in line for s in NOT_THE_REASON)]
    if errors:
        return one_line(errors[-1])
    return one_line(lines[-1]) if lines else None


@dataclass
class Step:
    """One step's record in the JSON."""

    name: str
    required: bool = True
    outcome: str = "skipped"          # ok, failed, timeout, skipped
    started_s: Optional[float] = None  # from the start of the check
    seconds: float = 0.0
    limit_s: Optional[float] = None
    commands: List[str] = field(default_factory=list)
    error: Optional[str] = None
    reason: Optional[str] = None      # why it was skipped
    result: Dict[str, Any] = field(default_factory=dict)
    log: Optional[str] = None
    printed: bool = False

    def json(self) -> Dict[str, Any]:
        record = {"name": self.name, "issue_step": ISSUE_STEP[self.name], "required": self.required,
                  "outcome": self.outcome, "started_s": self.started_s, "seconds": round(self.seconds, 2),
                  "limit_s": self.limit_s, "commands": self.commands, "error": self.error, "result": self.result,
                  "log": self.log}
        if self.reason:
            record["reason"] = self.reason
        return record


class StepFailed(Exception):
    """A step found something wrong: its error line."""


class TimedOut(Exception):
    pass


class Check:
    def __init__(self) -> None:
        env = os.environ
        self.device = env.get("GPU_CHECK_DEVICE", "cuda")
        if self.device not in ("cuda", "cpu"):
            refuse(f"GPU_CHECK_DEVICE={self.device}: choose cuda or cpu")
        self.python = sys.executable
        self.work = Path(env.get("GPU_CHECK_WORK") or ROOT / "runs" / "gpu-check" / self.device).resolve()
        default_out = ROOT / "benchmarks" / "results" / "gpu" if self.device == "cuda" else self.work
        self.out = Path(env.get("GPU_CHECK_OUT") or default_out).resolve()
        self.carry = Path(env.get("GPU_CHECK_CARRY") or ROOT / "runs" / "gpu-carry").resolve()
        try:
            self.budget = float(env.get("GPU_CHECK_BUDGET") or BUDGET[self.device])
        except ValueError:
            refuse(f"GPU_CHECK_BUDGET={env['GPU_CHECK_BUDGET']}: give seconds")
        self.only = [s for s in env.get("GPU_CHECK_STEPS", "").split(",") if s] or list(STEPS)
        self.force_fail = [s for s in env.get("GPU_CHECK_FAIL", "").split(",") if s]
        for name in [*self.only, *self.force_fail]:
            if name not in STEPS:
                refuse(f"unknown step {name!r} in GPU_CHECK_STEPS/GPU_CHECK_FAIL; the steps: {','.join(STEPS)}")
        self.build_wanted = env.get("GPU_CHECK_HOROVOD_BUILD", "auto")
        self.nproc_wanted = env.get("GPU_CHECK_NPROC")
        self.start = now()
        self.deadline = self.start + self.budget
        self.steps: Dict[str, Step] = {name: Step(name, required=name != "horovod_build") for name in STEPS}
        self.versions: Dict[str, Any] = {}
        self.compat: Dict[str, Any] = {}
        self.env = dict(os.environ)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        if self.device == "cuda":
            self.env["NCCL_DEBUG"] = "VERSION"  # NCCL says its version when a communicator starts: proof it ran
        self.nproc = 1
        self.children: List[subprocess.Popen] = []
        self.build: Optional[Dict[str, Any]] = None
        self.install_method: Optional[str] = None

    # --- running commands ------------------------------------------------------------------------------------
    def bin(self, name: str) -> List[str]:
        """A console script of this python (torchrun, horovodrun), else `python -m` its module."""
        beside = Path(self.python).parent / name
        if beside.exists():
            return [str(beside)]
        found = shutil.which(name)
        if found:
            return [found]
        modules = {"torchrun": "torch.distributed.run", "horovodrun": "horovod.runner.launch"}
        return [self.python, "-m", modules[name]]

    def left(self, name: str) -> float:
        """The seconds `name` may take: its box, less what the later steps keep back, within the budget."""
        later = STEPS[STEPS.index(name) + 1:]
        reserve = sum(RESERVE[self.device][s] for s in later if s in self.only)
        return min(BOX[self.device][name], self.deadline - now() - reserve)

    def start_command(self, cmd: List[str], log: Path, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            f.write(f"$ {' '.join(cmd)}\n".encode())
            f.flush()
            process = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=ROOT, env=env or self.env, start_new_session=True)
        self.children.append(process)
        return process

    def stop(self, process: subprocess.Popen) -> None:
        """SIGTERM to the command's process group (torchrun passes it to its workers), SIGKILL 10 s later."""
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue

    def run(self, step: Step, cmd: List[str], until: float, env: Optional[Dict[str, str]] = None,
            shown: Optional[str] = None) -> str:
        """Run `cmd` to its end or `until` (monotonic seconds); its output, appended to the step's log. A non-zero
        exit raises StepFailed with the error line, the time box TimedOut. The JSON records `shown`, else `cmd`."""
        step.commands.append(shown or " ".join(cmd))
        log = self.work / "logs" / f"{step.name}.log"
        step.log = str(log.relative_to(self.work))
        offset = log.stat().st_size if log.exists() else 0
        process = self.start_command(cmd, log, env)
        try:
            code = process.wait(max(0.0, until - now()))
        except subprocess.TimeoutExpired:
            self.stop(process)
            code = None
        # Not on an interrupt (SIGINT, SIGTERM): then it is still running, and main() stops it with the others.
        self.children.remove(process)
        with open(log, "rb") as f:
            f.seek(offset)
            output = f.read().decode(errors="replace")
        if code is None:
            raise TimedOut(f"stopped after its time box ({step.limit_s:.0f} s): {error_line(output) or 'no output'}")
        if code != 0:
            raise StepFailed(f"exit code {code}: {error_line(output) or 'no output'}")
        return output

    # --- the steps ---------------------------------------------------------------------------------------------
    def forced(self, name: str) -> List[str]:
        return [FORCED_FAILURE] if name in self.force_fail else []

    def training(self, **changes: Optional[str]) -> List[str]:
        """The training options of every run, with `changes` (option name without dashes, underscores for dashes;
        None drops the option)."""
        options = dict(TRAIN[self.device])
        if self.device == "cuda":
            options["--batch-size"] = str(max(1, min(GPU_BATCH, KEPT_TRAIN_SAMPLES // (2 * self.nproc))))
        for key, value in changes.items():
            options["--" + key.replace("_", "-")] = value
        return [word for option, value in options.items() if value is not None
                for word in ((option,) if value == "" else (option, value))]

    def torchrun(self, nproc: int, program: List[str]) -> List[str]:
        return [*self.bin("torchrun"), "--rdzv-backend", "loopback", f"--nproc-per-node={nproc}", *program]

    def train(self, step: Step, until: float, options: List[str], run_dir: Path, nproc: Optional[int] = None,
              key: Optional[str] = None) -> Dict[str, Any]:
        """One ddp_train run under torchrun: what its run directory and output say, recorded in the step's result
        (under runs/`key` with a key), then checked."""
        n = nproc or self.nproc
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = self.torchrun(n, ["-m", "ddp_train", "--device", self.device, *options, "--run-dir", str(run_dir),
                                *self.forced(step.name)])
        output = self.run(step, cmd, until)
        run = self.read_run(run_dir, output)
        if key:
            step.result.setdefault("runs", {})[key] = run
        else:
            step.result.update(run)
        self.check_run(run_dir.name, run, n)
        return run

    def read_run(self, run_dir: Path, output: str) -> Dict[str, Any]:
        """What a run's directory and output say: its process group, each rank's device, NCCL's version line, its
        precision and memory format, speed, loss and weights."""
        try:
            config = json.loads((run_dir / "config.json").read_text())
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            raise StepFailed(f"{run_dir.name}: no complete run directory ({exc})") from None
        devices = {int(m.group(1)): {"local_rank": int(m.group(3)), "device": m.group(6)}
                   for m in BANNER.finditer(output)}
        nccl = NCCL_VERSION.findall(output)
        split = summary.get("time_split") or {}
        return {"run_dir": str(run_dir.relative_to(self.work)), "world_size": config["world_size"],
                "process_group": config["backend"].get("process_group"), "nccl": nccl[0] if nccl else None,
                "devices": [devices[r]["device"] for r in sorted(devices)],
                "local_ranks": [devices[r]["local_rank"] for r in sorted(devices)],
                "precision": config.get("precision"), "channels_last": config["config"].get("channels_last"),
                "reduction": config.get("reduction"), "global_batch": config.get("global_batch"),
                "steps": summary.get("steps"), "samples_per_s": summary.get("samples_per_s"),
                "step_ms": split.get("step_ms"), "data_ms": split.get("data_ms"), "comm_frac": split.get("comm_frac"),
                "train_loss": summary.get("train_loss"), "wall_s": summary.get("wall_s"),
                "weights_sha256": summary.get("weights_sha256"),
                "buffers_keyword": config["backend"].get("ddp_built", {}).get("buffers_keyword")}

    def check_run(self, name: str, run: Dict[str, Any], n: int) -> None:
        """NCCL (Gloo in the rehearsal), every rank on the device of its local rank, a finite loss."""
        want = "nccl" if self.device == "cuda" else "gloo"
        if run["process_group"] != want:
            raise StepFailed(f"{name}: the process group is {run['process_group']}, not {want}")
        if len(run["devices"]) != n:
            raise StepFailed(f"{name}: {len(run['devices'])} of {n} ranks said which device they train on")
        for rank, (device, local_rank) in enumerate(zip(run["devices"], run["local_ranks"], strict=True)):
            want_device = f"cuda:{local_rank}" if self.device == "cuda" else "cpu"
            if device != want_device:
                raise StepFailed(f"{name}: rank {rank} (local rank {local_rank}) trains on {device}, not {want_device}")
        if self.device == "cuda" and not run["nccl"]:
            raise StepFailed(f"{name}: NCCL never started a communicator (no 'NCCL version' line under "
                             "NCCL_DEBUG=VERSION)")
        if not math.isfinite(run["train_loss"] if run["train_loss"] is not None else float("nan")):
            raise StepFailed(f"{name}: the training loss is {run['train_loss']}")

    def step_install(self, step: Step, until: float) -> None:
        """pip install --no-deps --no-build-isolation -e . into this python (offline: --no-index); where pip
        cannot, the tree on PYTHONPATH with the project's metadata (entry points) written beside it."""
        cmd = [self.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", "-e", str(ROOT), *self.forced(step.name)]
        try:
            self.run(step, cmd, until)
            self.install_method = "pip install --no-deps --no-build-isolation -e ."
        except (StepFailed, TimedOut) as exc:
            step.result["pip_error"] = str(exc)
            site = self.work / "site"
            write_metadata(site)
            # The metadata first: an egg-info a build left in the tree would be found before it.
            before = [self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else []
            self.env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), *before])
            self.install_method = "PYTHONPATH (pip could not install: see pip_error)"
            step.commands.append(f"PYTHONPATH={self.env['PYTHONPATH']}")
        step.result["method"] = self.install_method
        self.probe(step, until)

    def probe(self, step: Step, until: float) -> None:
        """The versions, the GPUs and what the project's code finds in this python (PROBE); the world size."""
        output = self.run(step, [self.python, "-c", PROBE], until,
                          shown=f"{self.python} -c PROBE (scripts/gpu_check.py)")
        found = json.loads(output.strip().splitlines()[-1])
        step.result["project"] = found.pop("project")
        step.result["entry_points"] = found.pop("entry_points")
        step.result["metadata"] = found.pop("metadata")
        self.compat = found.pop("compat")
        self.versions.update(found)
        self.nproc = int(self.nproc_wanted or (found["gpu_count"] if self.device == "cuda" else 2))
        if not step.result["entry_points"].get("loopback"):
            raise StepFailed("torchrun's loopback rendezvous is not registered (the project's entry points)")
        if self.device == "cuda" and not found["cuda_available"]:
            raise StepFailed(f"torch {found['torch']} sees no CUDA device")

    def step_ddp(self, step: Step, until: float) -> None:
        self.train(step, until, self.training(), self.work / "ddp")

    def step_amp_fp16(self, step: Step, until: float) -> None:
        if self.device == "cpu":
            step.reason = "float16 autocast with a GradScaler runs on CUDA only (refused on CPU: tests/test_knobs.py)"
            return
        self.train(step, until, self.training(amp="fp16"), self.work / "amp_fp16")
        if not (step.result["precision"] or {}).get("grad_scaler"):
            raise StepFailed("--amp fp16 ran without a GradScaler")

    def step_amp_bf16(self, step: Step, until: float) -> None:
        self.train(step, until, self.training(amp="bf16"), self.work / "amp_bf16")
        if (step.result["precision"] or {}).get("amp") != "bf16":
            raise StepFailed(f"--amp bf16 recorded precision {step.result['precision']}")

    def step_channels_last(self, step: Step, until: float) -> None:
        self.train(step, until, self.training(channels_last=""), self.work / "channels_last")
        if step.result["channels_last"] is not True:
            raise StepFailed("--channels-last is not recorded in config.json")

    def step_exact(self, step: Step, until: float) -> None:
        """--reduction exact twice at the GPU count (the same bits), and at 1 where there are 2 or more."""
        micro, steps = EXACT[self.device]["micro_batch"], EXACT[self.device]["max_steps"]
        options = self.training(reduction="exact", micro_batch=str(micro), global_batch=str(2 * micro * self.nproc),
                                max_steps=str(steps), batch_size=None)
        plan = [("a", self.nproc), ("b", self.nproc)] + ([("one", 1)] if self.nproc >= 2 else [])
        runs = {name: self.train(step, until, options, self.work / "exact" / name, nproc=n, key=name)
                for name, n in plan}
        sha = {name: run["weights_sha256"] for name, run in runs.items()}
        step.result.update({"weights_sha256": sha, "repeat_identical": sha["a"] == sha["b"],
                            "world_sizes_identical": sha["a"] == sha["one"] if "one" in sha else None})
        if sha["a"] != sha["b"]:
            self.exact_diagnosis(step, until, options)
            raise StepFailed(f"two --reduction exact runs at world size {self.nproc} end with different weights "
                             f"({sha['a'][:12]} and {sha['b'][:12]})")
        if "one" in sha and sha["one"] != sha["a"]:
            raise StepFailed(f"--reduction exact at world size 1 and {self.nproc} end with different weights "
                             f"({sha['one'][:12]} and {sha['a'][:12]})")

    def exact_diagnosis(self, step: Step, until: float, options: List[str]) -> None:
        """Where two exact runs differ: the same twice more with torch's deterministic algorithms (--deterministic),
        within the step's box; recorded under `deterministic`, whatever it finds."""
        try:
            runs = [self.train(step, until, [*options, "--deterministic"], self.work / "exact" / name, key=name)
                    for name in ("deterministic_a", "deterministic_b")]
            step.result["deterministic"] = {"identical": runs[0]["weights_sha256"] == runs[1]["weights_sha256"]}
        except (StepFailed, TimedOut) as exc:
            step.result["deterministic"] = {"error": str(exc)}

    def step_horovod_api(self, step: Step, until: float) -> None:
        out = self.work / "horovod_api"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        result_file = out / "result.json"
        cmd = self.torchrun(self.nproc, ["-m", "ddp_train.horovod_api", HVD_SCRIPT, *HVD_ARGS[self.device],
                                         "--result", str(result_file), *self.forced(step.name)])
        output = self.run(step, cmd, until)
        try:
            result = json.loads(result_file.read_text())
        except (OSError, ValueError) as exc:
            raise StepFailed(f"{HVD_SCRIPT} wrote no result ({exc})") from None
        nccl = NCCL_VERSION.findall(output)
        step.result.update(result, nccl=nccl[0] if nccl else None)
        if result["size"] != self.nproc:
            raise StepFailed(f"hvd.size() is {result['size']}, not {self.nproc}")
        for worker in result["workers"]:
            want = f"cuda:{worker['local_rank']}" if self.device == "cuda" else "cpu"
            if worker["device"] != want:
                raise StepFailed(f"worker {worker['rank']} trained on {worker['device']}, not {want}")
        if result["allreduce_sum"] != result["allreduce_sum_expected"]:
            raise StepFailed(f"hvd.allreduce(rank, op=hvd.Sum) gave {result['allreduce_sum']}, not "
                             f"{result['allreduce_sum_expected']}")
        if not result["weights_equal"]:
            raise StepFailed("the workers ended with different weights")
        if not result["losses_finite"]:
            raise StepFailed("a loss is not finite")
        if self.device == "cuda" and not (result["nccl_built"] and nccl):
            raise StepFailed("CUDA tensors did not travel on NCCL (hvd.nccl_built() 0 or no 'NCCL version' line)")

    # --- step 5: Horovod built with NCCL, beside the other steps ---------------------------------------------
    def horovod_installed(self) -> Optional[Dict[str, Any]]:
        code = ("import json, horovod, horovod.torch as hvd; print(json.dumps({'version': horovod.__version__, "
                "'nccl_built': int(hvd.nccl_built()), 'gloo_built': bool(hvd.gloo_built()), "
                "'mpi_built': bool(hvd.mpi_built())}))")
        found = subprocess.run([self.python, "-c", code], capture_output=True, text=True, env=self.env, cwd=ROOT,
                               timeout=120)
        if found.returncode != 0:
            return None
        return json.loads(found.stdout.strip().splitlines()[-1])

    def build_prerequisites(self) -> Dict[str, Any]:
        """What building Horovod here needs, found or not: its source, compilers, NCCL's headers and library."""
        sdist = self.carry / f"horovod-{HOROVOD_VERSION}.tar.gz"
        found: Dict[str, Any] = {"sdist": str(sdist) if sdist.exists() else None,
                                 "cmake": shutil.which("cmake"), "cxx": shutil.which("c++") or shutil.which("g++"),
                                 "cuda_home": cuda_home(),
                                 "mpi": shutil.which("mpicc")}
        if self.device == "cuda":
            found.update(self.nccl_paths())
        missing = [what for what in ("sdist", "cmake", "cxx") if not found[what]]
        if self.device == "cuda":
            missing += [what for what in ("cuda_home", "nccl_include", "nccl_lib") if not found.get(what)]
        found["missing"] = missing
        return found

    def nccl_paths(self) -> Dict[str, Optional[str]]:
        """NCCL's header and library: those of the nvidia-nccl wheel torch uses, else the system's."""
        code = ("import json, os\ntry:\n    import nvidia.nccl as n; d = list(n.__path__)[0]\nexcept ImportError:\n"
                "    d = None\nprint(json.dumps(d))")
        found = subprocess.run([self.python, "-c", code], capture_output=True, text=True, env=self.env, timeout=60)
        home = json.loads(found.stdout.strip() or "null") if found.returncode == 0 else None
        include = lib = None
        for candidate in ([home] if home else []) + ["/usr", "/usr/local/cuda"]:
            if not include and Path(candidate, "include", "nccl.h").exists():
                include = str(Path(candidate, "include"))
            for libdir in ("lib", "lib64", "lib/x86_64-linux-gnu"):
                libs = sorted(Path(candidate, libdir).glob("libnccl.so*")) if Path(candidate, libdir).is_dir() else []
                if not lib and libs:
                    lib = str(libs[0])
        return {"nccl_include": include, "nccl_lib": lib}

    def start_build(self) -> None:
        """Build Horovod (scripts/build_horovod.sh: NCCL on a GPU, the Gloo controller) from the carried source,
        offline, then install it into this python; in the background, the whole within its time box."""
        step = self.steps["horovod_build"]
        step.started_s = round(now() - self.start, 2)
        installed = self.horovod_installed()
        wanted = self.build_wanted
        if wanted == "auto":
            wanted = "1" if self.device == "cuda" else "0"
        if installed and (self.device == "cpu" or installed["nccl_built"]) and wanted != "1":
            step.reason = f"Horovod {installed['version']} is installed already (not rebuilt)"
            step.result["installed"] = installed
            return
        if wanted != "1":
            step.reason = "the rehearsal does not build Horovod (GPU_CHECK_HOROVOD_BUILD=1 does)"
            return
        found = self.build_prerequisites()
        step.result["prerequisites"] = found
        if found["missing"]:
            step.reason = (f"cannot build here: no {', '.join(found['missing'])}"
                           + (f" (the source is carried in {self.carry}: docs/gpu-check.md#carry)"
                              if "sdist" in found["missing"] else ""))
            return
        flavour = "nccl" if self.device == "cuda" else "cpu"
        wheels = self.work / "horovod-wheel"
        shutil.rmtree(wheels, ignore_errors=True)
        env = dict(self.env)
        # Offline: build_horovod.sh's pip finds the source and cffi in the carried folder, and builds without an
        # isolated environment (which pip would fill from an index).
        env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(self.carry), "PIP_NO_BUILD_ISOLATION": "0",
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        if not found["mpi"]:
            env["HOROVOD_WITHOUT_MPI"] = "1"  # no MPI on the machine: the Gloo controller alone
            step.result["note"] = ("built without MPI: horovodrun --check-build lists MPI all the same, since "
                                   "build_horovod.sh answers yes for both controllers of its builds")
        if flavour == "nccl":
            links = self.work / "nccl-lib"  # the wheel has libnccl.so.2 only; CMake looks for libnccl.so
            shutil.rmtree(links, ignore_errors=True)
            links.mkdir(parents=True)
            (links / "libnccl.so").symlink_to(found["nccl_lib"])
            env.update({"HOROVOD_NCCL_INCLUDE": found["nccl_include"], "HOROVOD_NCCL_LIB": str(links),
                        "HOROVOD_NCCL_LINK": "SHARED",
                        # The toolkit for CMake (nvcc, headers, cudart), torch's extension builder and Horovod.
                        "CUDA_HOME": found["cuda_home"], "CUDAToolkit_ROOT": found["cuda_home"],
                        "HOROVOD_CUDA_HOME": found["cuda_home"],
                        "PATH": f"{Path(found['cuda_home'], 'bin')}{os.pathsep}{env.get('PATH', '')}"})
            capability = self.versions.get("gpu_capability")
            if capability:
                env["HOROVOD_BUILD_CUDA_CC_LIST"] = capability  # this GPU's only: nvcc builds one architecture
        script = (f"bash scripts/build_horovod.sh {self.python} {HOROVOD_VERSION} {flavour} {wheels} && "
                  f"{self.python} -m pip install --no-deps --no-index --force-reinstall {wheels}/horovod-*.whl && "
                  f"{self.python} -m horovod.runner.launch --check-build")  # horovodrun
        step.commands.append(script)
        step.limit_s = min(BOX[self.device]["horovod_build"],
                           self.deadline - now() - RESERVE[self.device]["compare"])
        log = self.work / "logs" / "horovod_build.log"
        step.log = str(log.relative_to(self.work))
        # On every core (build_horovod.sh's make -j), below the training runs beside it in priority.
        self.build = {"process": self.start_command(["nice", "-n", "10", "bash", "-c", script], log, env), "log": log,
                      "until": now() + step.limit_s, "begun": now()}

    def finish_build(self) -> None:
        """Wait for the build (within its box) and record it."""
        step, build = self.steps["horovod_build"], self.build
        if build is None:
            if not step.printed:
                step.printed = True
                print(f"[{PROG}] {summary_line(step)}", flush=True)
            return
        self.build = None
        try:
            self.wait_build(step, build)
        finally:
            step.printed = True
            print(f"[{PROG}] {summary_line(step)}", flush=True)

    def wait_build(self, step: Step, build: Dict[str, Any]) -> None:
        process = build["process"]
        try:
            code = process.wait(max(0.0, build["until"] - now()))
        except subprocess.TimeoutExpired:
            self.stop(process)
            code = None
        self.children.remove(process)
        step.seconds = now() - build["begun"]
        output = build["log"].read_text(errors="replace")
        if code is None:
            step.outcome, step.error = "timeout", (f"stopped after its time box ({step.limit_s:.0f} s): "
                                                   f"{error_line(output) or 'no output'}")
            return
        if code != 0:
            step.outcome, step.error = "failed", f"exit code {code}: {error_line(output) or 'no output'}"
            return
        step.outcome = "ok"
        step.result["check_build"] = [line.strip() for line in output.splitlines()
                                      if re.match(r"\s*\[[X ]\]", line)]
        step.result["installed"] = self.horovod_installed()

    # --- step 6 ----------------------------------------------------------------------------------------------
    def step_compare(self, step: Step, until: float) -> None:
        horovod = self.horovod_installed()
        backends = "ddp,horovod" if horovod else "ddp"
        step.result["backends"] = backends
        step.result["horovod"] = horovod
        out = self.work / "compare"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [self.python, "-m", "common.compare", "--np", str(self.nproc), "--backends", backends,
               *(["--hvd-controllers", "gloo"] if horovod else []), "--repeats", "1", "--noise-floor", "off",
               "--explain", "none", "--out", str(out), "--device", self.device, *self.training(),
               *self.forced(step.name)]
        self.run(step, cmd, until)
        summary = json.loads((out / "summary.json").read_text())
        step.result["runs"] = [{"name": r["name"], "backend": r["backend"], "world_size": r["world_size"],
                                "samples_per_s": (r.get("summary") or {}).get("samples_per_s"),
                                "weights_sha256": (r.get("summary") or {}).get("weights_sha256")}
                               for r in summary["runs"]]
        step.result["verdicts"] = {f"{row['world_size']}: {column}": cell["text"]
                                   for row in summary["summary"]["rows"] for column, cell in row["cells"].items()}
        step.result["speed"] = summary["summary"]["speed"]
        if summary.get("failures"):
            raise StepFailed(f"a run of the comparison failed: {one_line(json.dumps(summary['failures']))}")

    # --- the whole ---------------------------------------------------------------------------------------------
    def run_step(self, name: str) -> None:
        step = self.steps[name]
        if name not in self.only:
            step.reason = "not in GPU_CHECK_STEPS"
            if name == "install":  # the project is importable already: only what it finds
                step.limit_s = round(self.left(name), 1)
                try:
                    self.probe(step, now() + step.limit_s)
                except (StepFailed, TimedOut) as exc:
                    step.outcome, step.error = "failed", str(exc)
            return
        if name != "install" and self.steps["install"].outcome in ("failed", "timeout"):
            step.reason = "step install failed"
            return
        step.limit_s = round(self.left(name), 1)
        step.started_s = round(now() - self.start, 2)
        began = now()
        if step.limit_s < RESERVE[self.device][name] or step.limit_s <= 0:
            step.outcome, step.error = "failed", f"no time left in the budget of {self.budget:.0f} s"
            return
        try:
            getattr(self, f"step_{name}")(step, now() + step.limit_s)
            if step.reason is None:
                step.outcome = "ok"
        except TimedOut as exc:
            step.outcome, step.error = "timeout", str(exc)
        except StepFailed as exc:
            step.outcome, step.error = "failed", str(exc)
        except Exception as exc:  # a bug of the check itself: recorded like a failure
            step.outcome, step.error = "failed", one_line(f"{type(exc).__name__}: {exc}")
        step.seconds = now() - began
        if step.outcome == "failed" and step.log:
            step.result["log_tail"] = tail(self.work / step.log, 20)
        print(f"[{PROG}] {summary_line(step)}", flush=True)

    def main(self) -> int:
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.out.mkdir(parents=True, exist_ok=True)
        print(f"[{PROG}] {self.device}: steps {','.join(self.only)}; budget {self.budget:.0f} s; work in {self.work}",
              flush=True)
        interrupted = None
        build = self.steps["horovod_build"]
        try:
            for name in STEPS:
                if name == "horovod_build":
                    continue  # started after step 1 (its speed measured alone), finished before step 6
                if name == "compare":
                    self.finish_build()
                self.run_step(name)
                if name == "ddp":
                    if "horovod_build" not in self.only:
                        build.reason = "not in GPU_CHECK_STEPS"
                    elif self.steps["install"].outcome in ("failed", "timeout"):
                        build.reason = "step install failed"
                    else:
                        self.start_build()
            self.finish_build()
        except KeyboardInterrupt:
            interrupted = "interrupted (SIGINT or SIGTERM)"
        finally:
            for process in list(self.children):
                self.stop(process)
        return self.write(interrupted)

    def write(self, interrupted: Optional[str]) -> int:
        failed = [s.name for s in self.steps.values() if s.required and s.outcome in ("failed", "timeout")]
        ok = not failed and interrupted is None
        record = {"check": "scripts/gpu_check.sh", "device": self.device, "rehearsal": self.device == "cpu",
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "ok": ok, "failed": failed, "interrupted": interrupted,
                  "wall_s": round(now() - self.start, 2), "budget_s": self.budget, "world_size": self.nproc,
                  "install": self.install_method, "versions": self.versions, "compat": self.compat,
                  "forced_failures": self.force_fail, "steps": [s.json() for s in self.steps.values()]}
        path = self.out / "gpu_check.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        logs = self.work / "logs"
        if logs.is_dir():
            with tarfile.open(self.out / "gpu_check_logs.tar.gz", "w:gz") as tar:
                tar.add(logs, arcname="logs")
        verdict = "ok" if ok else f"FAILED: {', '.join(failed) or interrupted}"
        print(f"[{PROG}] {verdict} in {record['wall_s']:.0f} s; {path}", flush=True)
        return 0 if ok else 1


def cuda_home() -> Optional[str]:
    """The CUDA toolkit to build with: a folder with bin/nvcc and cuda_runtime.h ($CUDA_HOME, /usr/local/cuda,
    /usr/local/cuda-*, the one above the nvcc on PATH)."""
    nvcc = shutil.which("nvcc")
    candidates = ([Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []) + CUDA_ROOTS + (
        [Path(nvcc).resolve().parents[1]] if nvcc else [])
    for root in candidates:
        headers = [root / "include", root / "targets" / "x86_64-linux" / "include"]
        if (root / "bin" / "nvcc").exists() and any((h / "cuda_runtime.h").exists() for h in headers):
            return str(root)
    return None


def tail(path: Path, lines: int) -> List[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def summary_line(step: Step) -> str:
    text = f"{step.name}: {step.outcome} in {step.seconds:.1f} s"
    if step.error:
        return f"{text}: {step.error}"
    if step.reason:
        return f"{text} ({step.reason})"
    r = step.result
    if step.name == "install":
        text += f": {r.get('method')}" + (f" ({r['pip_error']})" if r.get("pip_error") else "")
    if "samples_per_s" in r and r["samples_per_s"]:
        text += f": {r['process_group']}, {r['devices']}, {r['samples_per_s']:.0f} samples/s"
    if "repeat_identical" in r:
        text += f": repeat identical {r['repeat_identical']}, across world sizes {r['world_sizes_identical']}"
    if "img_sec_total" in r:
        text += f": {r['size']} worker(s), {r['img_sec_total']:.0f} img/s"
    if "verdicts" in r:
        text += f": {r['verdicts']}"
    return text


def write_metadata(site: Path) -> None:
    """The project's metadata (name, version, entry points) as a dist-info folder in `site`: on PYTHONPATH beside
    the tree, importlib.metadata finds the launchers, torchrun's loopback rendezvous and the API's entry points."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    shutil.rmtree(site, ignore_errors=True)
    info.mkdir(parents=True)
    requires = "".join(f"Requires-Dist: {r}\n" for r in project.get("dependencies", []))
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
                                   f"{requires}")
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n"
                   for group, items in groups.items())
    (info / "entry_points.txt").write_text(text)


#: run in the check's python once the project is installed: versions, the GPU, what the project's code finds
PROBE = r"""
import json, os, platform, subprocess, sys
from importlib import metadata
import torch
found = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
         "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
         "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
for name in ("torchvision", "numpy", "horovod", "setuptools", "pip", "hvd-ddp-compare"):
    found[name] = version(name)
if torch.cuda.is_available():
    found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    found["cudnn"] = torch.backends.cudnn.version()
    found["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    found["gpu_name"] = found["gpu_names"][0]
    found["gpu_capability"] = "%d%d" % torch.cuda.get_device_capability(0)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        found["driver"] = smi.stdout.split("\n")[0].strip() or None
    except (OSError, subprocess.TimeoutExpired):
        found["driver"] = None
import common, ddp_train, hvd_train
from ddp_train.backend import buffers_not_synced_each_forward
from torch.nn.parallel import DistributedDataParallel
found["project"] = {"path": os.path.dirname(os.path.dirname(common.__file__))}
try:
    found["project"]["git"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                             cwd=found["project"]["path"], timeout=30).stdout.strip() or None
except OSError:
    found["project"]["git"] = None
groups = {"loopback": "torchrun.handlers", "launchers": "hvd_ddp_compare.launchers", "apis": "hvd_ddp_compare.apis"}
found["entry_points"] = {key: sorted(e.name for e in metadata.entry_points(group=group))
                         for key, group in groups.items()}
found["entry_points"]["loopback"] = "loopback" in found["entry_points"]["loopback"]
# where the project's metadata was found: the environment's (pip) or the folder written beside the tree
handlers = [e for e in metadata.entry_points(group="torchrun.handlers") if e.name == "loopback"]
found["metadata"] = os.path.abspath(str(getattr(handlers[0].dist, "_path", ""))) if handlers else None
pin = [r for r in (metadata.requires("hvd-ddp-compare") or []) if r.startswith("torch==")]
keyword = next(iter(buffers_not_synced_each_forward(DistributedDataParallel.__init__)))
found["compat"] = {
    "torch_pinned": pin[0].split("==")[1] if pin else None, "torch_here": torch.__version__,
    "ddp_forward_sync_buffers": keyword == "forward_sync_buffers",
    "ddp_buffers_keyword": keyword,
    "notes": [] if keyword == "forward_sync_buffers" else [
        "DDP has no forward_sync_buffers in this torch (added in 2.13): ddp_train passes broadcast_buffers=False and "
        "broadcasts the buffers from rank 0 itself at wrap, as DDP does with forward_sync_buffers=False"]}
print(json.dumps(found))
"""


def prepare(carry: Path) -> int:
    """On a machine with PyPI: what the Horovod build needs offline, into `carry` (runs/gpu-carry): Horovod's
    source, and cffi with pycparser for the GPU machine's Python (build_horovod.sh installs cffi)."""
    carry.mkdir(parents=True, exist_ok=True)
    python_version = os.environ.get("GPU_CHECK_CARRY_PYTHON", "3.12")
    commands = [
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", f"horovod=={HOROVOD_VERSION}",
         "-d", str(carry)],
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--python-version",
         python_version, "--implementation", "cp", "--platform", "manylinux_2_17_x86_64", "--platform",
         "manylinux2014_x86_64", "cffi", "pycparser", "-d", str(carry)],
    ]
    for cmd in commands:
        print("$ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            print(f"{PROG}: error: {' '.join(cmd[3:5])} failed (above)", file=sys.stderr)
            return 1
    size = sum(p.stat().st_size for p in carry.iterdir() if p.is_file())
    print(f"[{PROG}] {carry}: {', '.join(sorted(p.name for p in carry.iterdir()))} ({size / 2**20:.1f} MiB)")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--prepare"]:
        return prepare(Path(os.environ.get("GPU_CHECK_CARRY") or ROOT / "runs" / "gpu-carry").resolve())
    if sys.argv[1:]:
        refuse(f"unknown arguments {' '.join(sys.argv[1:])}; the check takes none but --prepare (its settings are "
               "GPU_CHECK_* variables: docs/gpu-check.md)")
    check = Check()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    return check.main()


if __name__ == "__main__":
    sys.exit(main())
