"""What the Horovod API's negotiation costs per training step as the job grows, on the three paths a steady step can
take: the response cache off (HOROVOD_CACHE_CAPACITY=0: every request goes to rank 0), the cache's agreement (one
bitwise-AND allreduce a cycle, then the sums: the path of sums the guess does not take, measured with Max), and the
guess (the step's small sums reduced first with every rank's flag: no collective of the agreement at all). T small
tensors a step (161: ResNet-50's count of gradients; 16 floats each, so that their sum is one the guess takes), at
N ranks.

    python -m benchmarks.negotiation --np 2,8,64,256,1024 --tensors 161 --real-np 2,4,8,16 --out benchmarks/results

Simulated (every N), in one process and without torch: every rank is the engine's own state machine
(engine_core.EngineCore), driven cycle by cycle as the engine's thread drives it (start, the guess's count or the
agreement, settle, each collective run, end); rank 0's coordinator is the negotiation (negotiation.Negotiator) fed
the request frames every rank sent and encoding its responses (coordinator.frames). The agreement is recursive
doubling (log2 N rounds, each rank's vector packed and unpacked as it would travel); the guess's count is the sum of
the ranks' flags. Then rank 0's part (its machine, its coordinator, the frames and vectors it received) is replayed
alone and timed (thread time): one process holding every rank's objects would time rank 0 against a heap and CPU
caches that are not its own. The first step (every request negotiated by rank 0) is reported apart; the second,
the first agreed from the cache, arms the guess and is not reported; the steady steps follow.

Real (--real-np): N processes under torchrun running the API itself (hvd.init, T asynchronous allreduces a step,
synchronize), with the data of 16 floats per tensor; per step, the slowest rank's time from its first request until
it holds every result, and rank 0's engine's count of cycles agreed and guessed.

Writes DIR/negotiation.json and prints a table.
"""

from __future__ import annotations

import json
import math
import socket
import statistics
import struct
import sys
import threading
import time
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from common.compare.arguments import csv_list, world_sizes

from .jobs import Workers, add_out, add_worker, parser, refuse, run_cli

TARGET_RANK0_MS = 1.0
F32 = "HOROVOD_FLOAT32"
SHAPE = [16]
#: the steady step's three paths: the cache off, the agreement (Max: a reduction the guess never takes), the guess
PATHS = ("off", "agreement", "guess")
FLAG_BYTES = 4  # the guess's flag: one float32 more in the sums' buffer
#: the step after the first, run and not reported: the first agreed from the cache, which arms the guess
ARMING = 1
DEFINITIONS = {
    "path": "off: HOROVOD_CACHE_CAPACITY=0; agreement: the cache's bitwise-AND agreement, then the sums (sums the "
            "guess does not take, measured with Max); guess: the sums reduced first with every rank's flag, no "
            "agreement",
    "rank0_cpu_ms": "rank 0's CPU (thread time) of the negotiation in one steady step (its engine's state machine, "
                    "and with the cache off its coordinator), median of the steps",
    "wall_ms": "time until every rank holds its responses in one steady step: simulated, rank 0's CPU plus the "
               "latency of the rounds; real, the slowest rank's time from its first request until it holds every "
               "result (with the data)",
    "first_rank0_cpu_ms": "rank 0's CPU in the first step (every request negotiated by rank 0)",
    "rounds": "message rounds a rank waits on for the negotiation in one steady step: with the cache off its requests "
              "and the responses (2); with the agreement log2 N per cycle; the guess none of its own (its flag "
              "travels in the sums' allreduce)",
    "bytes_per_rank": "bytes one rank sends for the negotiation in one steady step: its request frames (cache off), "
                      "its vector once per round (agreement), its flag once per round of the sums (guess)",
    "collectives": "allreduces a rank runs in one steady step: the agreement's and the sums'",
    "requests_to_rank0": "requests rank 0 receives in one steady step",
    "cycles": "engine cycles of rank 0 in one steady step (real: agreed and guessed, as its engine counts them)",
    "target_rank0_ms": "the steady step's CPU at rank 0 must stay under this at every N for 161 tensors with the "
                       "cache on (agreement and guess)"}


@dataclass
class Part:
    """A rank's part in one collective, as the engine's state machine holds it (no tensor: negotiation only)."""

    request: Any


def op_of(path: str) -> int:
    from ddp_train.horovod_api.dtypes import MAX, SUM

    return MAX if path == "agreement" else SUM


def parts_of(rank: int, tensors: int, path: str) -> List[Part]:
    from ddp_train.horovod_api.messages import ALLREDUCE, Request

    op = op_of(path)
    return [Part(Request(rank, 0, 0, f"allreduce.grad{t}", ALLREDUCE, dtype=F32, shape=list(SHAPE), op=op))
            for t in range(tensors)]


def loopback_latency_s(nbytes: int, repeats: int = 2000) -> float:
    """One-way latency of an `nbytes` message on loopback TCP: half a measured round trip (median of a batch)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    for sock in (client, peer):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"x" * nbytes

    def echo() -> None:
        for _ in range(repeats):
            got = b""
            while len(got) < nbytes:
                got += peer.recv(nbytes - len(got))
            peer.sendall(got)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    trips = []
    for _ in range(repeats):
        started = time.perf_counter()
        client.sendall(payload)
        got = b""
        while len(got) < nbytes:
            got += client.recv(nbytes - len(got))
        trips.append(time.perf_counter() - started)
    thread.join()
    for sock in (client, peer, server):
        sock.close()
    return statistics.median(trips) / 2


# --- one rank's cycle, as the engine's thread drives its state machine ----------------------------------------------
def agreed_words(core: Any, start: Any, count: Optional[float], partners: Sequence[bytes]) -> List[int]:
    """What a cycle's collectives tell one rank: the guess's words where every rank's flag was 1, else the AND of
    the partners' vectors over the rounds (as they travel: packed, unpacked), else (cache off) its own words."""
    if not start.agree:
        return list(start.words)
    if start.guess is not None and count is not None:
        known = core.after_guess(count)
        if known is not None:
            return list(known)
    words = list(start.words)
    fmt = f"<{len(words)}Q"
    for partner in partners:
        struct.pack(fmt, *words)  # what it sends this round
        words = [a & b for a, b in zip(words, struct.unpack(fmt, partner), strict=True)]
    return words


def finish_cycle(core: Any, agreed: Sequence[int]) -> Tuple[int, int]:
    """The rest of one cycle: settle, each collective counted as run, the end; the tensors it ran, and the
    allreduces of sums among its collectives."""
    from ddp_train.horovod_api.messages import ALLREDUCE

    runs = core.settle(agreed)
    for run in runs:
        core.ran(run)
    core.end(0.0)
    return sum(len(run.response.names) for run in runs), sum(run.response.kind == ALLREDUCE for run in runs)


def decode_responses(frame: bytes) -> List[Any]:
    """The responses of one frame, as a rank's reader decodes them."""
    from ddp_train.horovod_api.messages import FrameReader, read_responses

    return [r for message in FrameReader().feed(frame) for r in read_responses(message)]


def recursive_doubling(vectors: List[List[int]]) -> Tuple[List[int], List[bytes]]:
    """The agreement over every rank's vector: the AND, and the vectors rank 0 received, round by round (log2 N
    rounds; each rank sends its whole vector once a round)."""
    size = len(vectors)
    fmt = f"<{len(vectors[0])}Q"
    current = [list(v) for v in vectors]
    received: List[bytes] = []
    distance = 1
    while distance < size:
        wire = [struct.pack(fmt, *v) for v in current]
        received.append(wire[distance])
        current = [[a & b for a, b in zip(current[rank], struct.unpack(fmt, wire[rank ^ distance]), strict=True)]
                   for rank in range(size)]
        distance <<= 1
    return current[0], received


@dataclass
class Heard:
    """What rank 0 received in one cycle, to replay its part alone (the request frames every rank sent its
    coordinator, its partners' vectors round by round, the guess's count), and what the cycle did."""

    step: int
    first: bool
    frames: List[bytes]
    partners: List[bytes]
    count: Optional[float]
    agreed: bool = False  # the agreement's collective ran
    guessed: bool = False  # the guess answered the cycle
    sums: int = 0  # allreduces of sums rank 0 ran


@dataclass
class Rank0:
    """Rank 0's coordinator: the negotiation and a frame reader per rank."""

    negotiator: Any
    readers: List[Any]
    everyone: List[int]
    requests: int = 0

    @staticmethod
    def of(ranks: int, broadcast: bool) -> "Rank0":
        from ddp_train.horovod_api.messages import FrameReader
        from ddp_train.horovod_api.negotiation import Negotiator
        from ddp_train.horovod_api.settings import Settings

        return Rank0(Negotiator(ranks, Settings(), broadcast=broadcast), [FrameReader() for _ in range(ranks)],
                     list(range(ranks)))

    def hear(self, frames: Sequence[Tuple[int, bytes]]) -> List[Tuple[int, bytes]]:
        """The coordinator's loop over what arrived: requests in, the answer, each rank's frame out."""
        from ddp_train.horovod_api.coordinator import frames as encode_frames
        from ddp_train.horovod_api.messages import read_requests

        for rank, frame in frames:
            for message in self.readers[rank].feed(frame):
                for request in read_requests(message):
                    self.negotiator.request(request, 0.0)
                    self.requests += 1
        if self.negotiator.due(0.0):
            self.negotiator.answer()
        return encode_frames(self.negotiator.take(), self.everyone)


def machine(path: str, ranks: int) -> Any:
    from ddp_train.horovod_api.cycle import RankCycle
    from ddp_train.horovod_api.engine_core import EngineCore
    from ddp_train.horovod_api.settings import Settings

    settings = Settings()
    capacity = 0 if path == "off" else settings.cache_capacity
    return EngineCore(RankCycle(capacity, 0.0, settings.fusion_threshold), ranks, settings.cycle_time_s)


# --- simulated: every rank ------------------------------------------------------------------------------------------
@dataclass
class Job:
    """Every rank's state machine and rank 0's coordinator in one process, and the tape of what rank 0 heard."""

    path: str
    ranks: int
    tensors: int
    cores: List[Any] = field(default_factory=list)
    tape: List[Heard] = field(default_factory=list)
    sent_bytes: Dict[int, int] = field(default_factory=dict)  # step -> bytes one rank (1) sent rank 0
    requests: Dict[int, int] = field(default_factory=dict)  # step -> requests rank 0 received
    _frames: Dict[Tuple[int, bool], List[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cores = [machine(self.path, self.ranks) for _ in range(self.ranks)]
        self.rank0 = Rank0.of(self.ranks, broadcast=self.path != "off")

    def step(self, step: int) -> None:
        """One training step: every rank submits its parts (with the cache off, one frame per tensor, as the
        optimizer's hooks ask); cycles until rank 0 ran every tensor of the step."""
        sent = [self._encoded(rank, step > 0, core.submit(parts_of(rank, self.tensors, self.path), 0.0).to_rank0)
                for rank, core in enumerate(self.cores)]
        done, first, before = 0, True, self.rank0.requests
        while done < self.tensors:
            ran, answers = self._cycle(step, first, sent)
            done, first, sent = done + ran, False, [[] for _ in range(self.ranks)]
            self._deliver(answers)
        self.requests[step] = self.rank0.requests - before

    def _cycle(self, step: int, first: bool, sent: List[List[bytes]]) -> Tuple[int, List[Tuple[int, bytes]]]:
        """One cycle on every rank, as the engine's thread runs it (what rank 0 heard goes on the tape): the tensors
        rank 0 ran, and the coordinator's answers."""
        from ddp_train.horovod_api.messages import encode, requests_message

        starts = [core.start(0.0) for core in self.cores]
        for rank, start in enumerate(starts):
            if start.to_rank0:
                sent[rank].append(encode(requests_message(start.to_rank0)))
        arrived = [(rank, frame) for rank in range(self.ranks) for frame in sent[rank]]
        self.sent_bytes[step] = self.sent_bytes.get(step, 0) + sum(len(f) for f in sent[min(1, self.ranks - 1)])
        answers = self.rank0.hear(arrived)
        count = sum(1.0 for s in starts if s.matched) if starts[0].guess is not None else None
        agreed = [agreed_words(core, s, count, []) for core, s in zip(self.cores, starts, strict=True)]
        heard = Heard(step, first, [f for _, f in arrived], [], count, guessed=count == self.ranks)
        if starts[0].agree and not heard.guessed:
            common, heard.partners = recursive_doubling(agreed)
            agreed, heard.agreed = [common] * self.ranks, True
        ran = [finish_cycle(core, words) for core, words in zip(self.cores, agreed, strict=True)]
        tensors, heard.sums = ran[0]
        self.tape.append(heard)
        return tensors, answers

    def _encoded(self, rank: int, again: bool, requests: List[Any]) -> List[bytes]:
        from ddp_train.horovod_api.messages import encode, requests_message

        if not requests:
            return []
        key = (rank, again)  # a step's requests are the same step after step: their frames too
        if key not in self._frames:
            self._frames[key] = [encode(requests_message([r])) for r in requests]
        return list(self._frames[key])

    def _deliver(self, answers: List[Tuple[int, bytes]]) -> None:
        decoded: Dict[bytes, List[Any]] = {}
        for rank, frame in answers:
            if frame not in decoded:
                decoded[frame] = decode_responses(frame)
            for response in decoded[frame]:
                self.cores[rank].receive(response)


def replay_rank0(job: Job, steps: int) -> List[float]:
    """Rank 0's CPU per step: a fresh machine and coordinator of its own, fed what rank 0 heard in the simulation."""
    from ddp_train.horovod_api.messages import encode, requests_message

    core, rank0 = machine(job.path, job.ranks), Rank0.of(job.ranks, broadcast=job.path != "off")
    cpu = [0.0] * steps
    for heard in job.tape:
        parts = parts_of(0, job.tensors, job.path) if heard.first else []  # the script's, not the negotiation's
        started = time.thread_time()
        if parts:
            for request in core.submit(parts, 0.0).to_rank0:
                encode(requests_message([request]))
        start = core.start(0.0)
        if start.to_rank0:
            encode(requests_message(start.to_rank0))
        answers = rank0.hear([(0, frame) for frame in heard.frames])  # (each frame whole: one reader reads them)
        finish_cycle(core, agreed_words(core, start, heard.count, heard.partners))
        for response in (r for rank, frame in answers if rank == 0 for r in decode_responses(frame)):
            core.receive(response)
        cpu[heard.step] += time.thread_time() - started
    return cpu


def simulate_path(path: str, ranks: int, tensors: int, steps: int, latency_s: float) -> Dict[str, Any]:
    """One path at one N and T: every rank simulated, rank 0 replayed alone; the first step, then `steps` - 1
    steady ones after the arming step (their median CPU; the last one's rounds and bytes)."""
    job = Job(path, ranks, tensors)
    total = steps + ARMING
    for step in range(total):
        job.step(step)
    cpu = replay_rank0(job, total)
    steady = statistics.median(cpu[1 + ARMING:])
    last = [h for h in job.tape if h.step == total - 1]
    agreements, guessed = sum(h.agreed for h in last), sum(h.guessed for h in last)
    doubling = math.ceil(math.log2(ranks)) if ranks > 1 else 0
    width = 8 * len(job.cores[0].cycle.vector(0.0))  # one rank's vector (bytes)
    rounds = 2 if path == "off" else agreements * doubling
    sent = job.sent_bytes.get(total - 1, 0) if path == "off" else (agreements * width + guessed * FLAG_BYTES) * doubling
    return {"rank0_cpu_ms": steady * 1e3, "first_rank0_cpu_ms": cpu[0] * 1e3, "rounds": rounds,
            "bytes_per_rank": sent, "collectives": agreements + sum(h.sums for h in last),
            "requests_to_rank0": job.requests[total - 1], "cycles": len(last), "agreed_cycles": agreements,
            "guessed_cycles": guessed, "wall_ms": (steady + rounds * latency_s) * 1e3}


def simulate(ranks: int, tensors: int, steps: int, latency_s: float) -> List[Dict[str, Any]]:
    """The three paths at one N and T."""
    rows = []
    for path in PATHS:
        row = {"mode": "simulated", "path": path, "ranks": ranks, "tensors": tensors,
               **simulate_path(path, ranks, tensors, steps, latency_s)}
        rows.append(row)
        print(f"simulated N={ranks:5d} T={tensors:5d} {path:9s}: rank 0 {row['rank0_cpu_ms']:9.3f} ms CPU, "
              f"rounds {row['rounds']:3d}, {row['bytes_per_rank']:7d} B, wall {row['wall_ms']:9.3f} ms, first step "
              f"{row['first_rank0_cpu_ms']:9.1f} ms", flush=True)
    return rows


# --- real processes -------------------------------------------------------------------------------------------------
def worker(args: Namespace) -> int:
    """One rank under torchrun running the API itself: T asynchronous allreduces a step, then synchronize."""
    import torch
    import torch.distributed as dist

    from common.launch.userscript import leave
    from ddp_train.horovod_api import runtime
    from ddp_train.horovod_api import torch_api as hvd

    hvd.init()
    tensors = [torch.zeros(SHAPE) for _ in range(int(args.tensors))]
    op = op_of(args.path)
    times, counts = [], []
    for _ in range(int(args.steps) + ARMING):
        dist.barrier()  # torch.distributed's own group: an API collective between steps disarms the guess
        before = runtime.cycle_counts()
        started = time.perf_counter()
        handles = [hvd.allreduce_async_(t, name=f"grad{i}", op=op) for i, t in enumerate(tensors)]
        for handle in handles:
            hvd.synchronize(handle)
        times.append(time.perf_counter() - started)
        after = runtime.cycle_counts()
        counts.append([after.agreed - before.agreed, after.guessed - before.guessed])
    slowest = hvd.allreduce(torch.tensor(times, dtype=torch.float64), op=hvd.Max, name="times")
    if hvd.rank() == 0:
        Path(args.result).write_text(json.dumps({"times_s": slowest.tolist(), "counts": counts}))
    hvd.shutdown()
    leave(0)  # not through the interpreter's teardown, where gloo's threads can abort a finished rank


def run_real(workers: Workers, ranks: int, tensors: int, path: str, steps: int) -> Optional[Dict[str, Any]]:
    """One real run: its row, or None when it failed."""
    capacity = {"HOROVOD_CACHE_CAPACITY": "0" if path == "off" else None}
    data = workers.run(f"real-{ranks}-{tensors}-{path}", "torchrun", ranks, "benchmarks.negotiation",
                       ["--worker", "--path", path, "--real-tensors", str(tensors), "--real-steps", str(steps)],
                       env=capacity, ranks=ranks, tensors=tensors, path=path)
    if data is None:
        return None
    times, counts = data["times_s"], data["counts"]
    steady = slice(1 + ARMING, None)
    row = {"mode": "real", "path": path, "ranks": ranks, "tensors": tensors,
           "wall_ms": statistics.median(times[steady]) * 1e3, "first_wall_ms": times[0] * 1e3,
           "agreed_cycles": statistics.median(c[0] for c in counts[steady]),
           "guessed_cycles": statistics.median(c[1] for c in counts[steady]), "times_s": times, "counts": counts}
    print(f"real      N={ranks:5d} T={tensors:5d} {path:9s}: wall {row['wall_ms']:9.3f} ms, cycles agreed "
          f"{row['agreed_cycles']:g} guessed {row['guessed_cycles']:g}, first step {row['first_wall_ms']:9.1f} ms",
          flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    """Simulate every N, then run the real ones (or be one rank, with --worker)."""
    p = parser("negotiation", __doc__)
    p.add_argument("--np", type=world_sizes, default=[2, 8, 64, 256, 1024], help="simulated world sizes")
    p.add_argument("--tensors", type=csv_list(int, minimum=1), default=[161],
                   help="tensors a step (161: ResNet-50's gradients)")
    p.add_argument("--steps", type=int, default=4,
                   help="steps per measurement: the first is reported apart; the steady ones follow a step that arms "
                        "the guess (run, not reported)")
    p.add_argument("--real-np", type=world_sizes, default=[2, 4, 8, 16], help="world sizes run as processes")
    p.add_argument("--real-steps", type=int, default=12, help="steps per real run (and the arming step)")
    add_out(p)
    add_worker(p, "--path", "--real-tensors")
    args = p.parse_args(argv)
    if args.worker:
        return worker(Namespace(path=args.path, tensors=args.real_tensors, steps=args.real_steps,
                                result=args.result))
    if args.steps < 2 or args.real_steps < 2:
        return refuse("negotiation", "--steps and --real-steps must be at least 2 (the first step is apart)")
    workers = Workers("negotiation", argv, args.out, timeout_s=900)
    latency = loopback_latency_s(64)
    rows: List[Dict[str, Any]] = []
    for tensors in args.tensors:
        for ranks in args.np:
            rows.extend(simulate(ranks, tensors, args.steps, latency))
    for tensors in args.tensors:
        for ranks in args.real_np:
            for path in PATHS:
                row = run_real(workers, ranks, tensors, path, args.real_steps)
                if row is not None:
                    rows.append(row)
    return workers.publish(settings={"np": args.np, "tensors": args.tensors, "steps": args.steps,
                                     "real_np": args.real_np, "real_steps": args.real_steps},
                           latency_s=latency, definitions=DEFINITIONS, target_rank0_ms=TARGET_RANK0_MS, rows=rows)


if __name__ == "__main__":
    sys.exit(run_cli(main, "negotiation"))
