"""What the Horovod API's negotiation costs per training step as the job grows: rank 0's CPU and the time until
every rank holds its responses, with the response cache on (Horovod's default) and off (HOROVOD_CACHE_CAPACITY=0),
for T tensors a step (161: ResNet-50's gradients) at N ranks.

    python -m benchmarks.negotiation --np 2,8,64,256,1024 --tensors 161,1000 --real-np 2,4,8,16 --out benchmarks/results

Simulated (every N), at the level of the messages, in one process, with the API's own negotiation code and no torch:
- cache off: rank 0 decodes one request frame per tensor per rank (DistributedOptimizer asks for each gradient on
  its own), runs the negotiation (negotiation.Negotiator) and encodes each rank's responses (coordinator.frames);
- cache on: every rank's cycle state (cycle.RankCycle) looks its T requests up, the ranks agree by recursive
  doubling (log2 N rounds; each round every rank sends its vector to one partner and ANDs the one it receives, bytes
  packed and unpacked as they would travel), and each rank reads the plan and fuses the allreduces.
Rank 0's CPU is the thread time of rank 0's own part only. The time until every rank holds its responses is the
critical path: rank 0's CPU (with the cache off every response waits for it; with it on every rank does the same
work at once) plus the message latency of one round trip (cache off) or of every round (cache on), measured here
on loopback TCP. The first step (every request negotiated by rank 0) is reported apart from the steady ones.

Real (--real-np): N processes under torchrun, the coordinator thread on rank 0 over real sockets and, with the cache
on, the agreement as a real Gloo allreduce; per step, the slowest rank's time from its first request until it holds
every response. No tensor moves in either: this is the negotiation alone.

Writes DIR/negotiation.json and prints a table.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import threading
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from common.compare.arguments import csv_list, world_sizes

from .jobs import Workers, add_out, add_worker, parser, refuse, run_cli

TARGET_RANK0_MS = 1.0
F32 = "HOROVOD_FLOAT32"
DEFINITIONS = {
    "rank0_cpu_ms": "rank 0's CPU (thread time) of the negotiation in one steady step, median of the steps",
    "wall_ms": "time until every rank holds its responses in one steady step: simulated, the critical path; real, "
               "the slowest rank's time from its first request",
    "first_rank0_cpu_ms": "rank 0's CPU in the first step (every request negotiated by rank 0)",
    "rounds": "message rounds of the agreement a rank waits on per cycle (cache on: log2 N)",
    "bytes_per_rank": "bytes one rank sends for the agreement per cycle (cache on)",
    "requests_to_rank0": "requests rank 0 receives in one steady step",
    "target_rank0_ms": "the steady step's CPU at rank 0 must stay under this at every N with the cache on"}


def requests_of(rank: int, tensors: int, checked: bool) -> List[Any]:
    from ddp_train.horovod_api.messages import ALLREDUCE, Request

    return [Request(rank, 0, 0, f"allreduce.grad{t}", ALLREDUCE, dtype=F32, shape=[64, 3, 3, 3], checked=checked)
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


# --- simulated: cache off ---------------------------------------------------------------------------------------
def cache_off(ranks: int, tensors: int, steps: int) -> Dict[str, Any]:
    """Rank 0's work per step under today's protocol: a frame per request in, each rank's responses out."""
    from ddp_train.horovod_api.coordinator import frames
    from ddp_train.horovod_api.messages import FrameReader, encode, read_requests, requests_message
    from ddp_train.horovod_api.negotiation import Negotiator
    from ddp_train.horovod_api.settings import Settings

    core = Negotiator(ranks, Settings())
    readers = [FrameReader() for _ in range(ranks)]
    everyone = list(range(ranks))
    cpu: List[float] = []
    for step in range(steps):
        sent = [[encode(requests_message([r])) for r in requests_of(rank, tensors, step > 0)]
                for rank in range(ranks)]
        started = time.thread_time()
        for t in range(tensors):
            for rank in range(ranks):  # the coordinator's loop: whatever arrived, then answer what is due
                for message in readers[rank].feed(sent[rank][t]):
                    for request in read_requests(message):
                        core.request(request, 0.0)
            if core.due(0.0):
                core.answer()
            frames(core.take(), everyone)
        cpu.append(time.thread_time() - started)
    steady = statistics.median(cpu[1:])
    return {"rank0_cpu_ms": steady * 1e3, "first_rank0_cpu_ms": cpu[0] * 1e3, "requests_to_rank0": ranks * tensors,
            "rounds": 1, "bytes_per_rank": None, "critical_path_s": steady}


# --- simulated: cache on ----------------------------------------------------------------------------------------
def _agree(vectors: List[List[int]]) -> Tuple[List[List[int]], List[bytes]]:
    """Recursive doubling over the ranks' vectors, as bytes: every rank's result, and the bytes rank 0 received in
    each round (log2 N rounds; each rank sends its whole vector once a round)."""
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
    return current, received


@dataclass
class Cycle:
    """What rank 0 received in one cycle of the simulation, to replay it alone: the step, the requests every rank
    sent its coordinator, and its partners' vectors, round by round."""

    step: int
    first: bool
    to_rank0: List[Any]
    partners: List[bytes]


def cache_on(ranks: int, tensors: int, steps: int) -> Dict[str, Any]:
    """Every rank's cycles, recorded; then rank 0's part replayed alone and timed (one process holding every rank's
    objects would time rank 0 against a heap and CPU caches that are not its own)."""
    from ddp_train.horovod_api.cycle import RankCycle
    from ddp_train.horovod_api.negotiation import Negotiator, Outgoing
    from ddp_train.horovod_api.settings import Settings

    settings = Settings()
    core = Negotiator(ranks, settings, broadcast=True)
    states = [RankCycle(settings.cache_capacity, 0.0, settings.fusion_threshold) for _ in range(ranks)]
    tape: List[Cycle] = []
    resent: List[Any] = []
    for step in range(steps):
        asked = [requests_of(rank, tensors, False) for rank in range(ranks)]
        mine = [{r.name: r for r in requests} for requests in asked]
        done, first = 0, True
        while done < tensors:  # cycles until rank 0 ran every tensor of the step
            vectors, to_rank0 = [], list(resent)
            for rank, state in enumerate(states):
                for request in asked[rank]:
                    state.ask(request)
                asked[rank] = []
                vectors.append(state.vector(0.0))
                to_rank0.extend(state.take_outgoing())
            for request in to_rank0:
                core.request(request, 0.0)
            if core.due(0.0):
                core.answer()
            for item in core.take():  # rank 0's responses reach every rank before the agreement
                if isinstance(item, Outgoing):
                    for response in item.responses:
                        for state in states:
                            state.hold(response)
            results, partners = _agree(vectors)
            tape.append(Cycle(step, first, to_rank0, partners))
            first, resent = False, []
            for rank, state in enumerate(states):
                plan = state.settle(results[rank])
                for response in plan.responses:
                    state.ran(response, mine[rank])
                resent.extend(state.take_outgoing())
                if rank == 0:
                    done += plan.tensors()
    cpu = replay_rank0(tape, ranks, tensors, steps)
    steady = statistics.median(cpu[1:])
    rounds = len(tape[-1].partners)
    width = len(tape[-1].partners[0]) if rounds else 0
    return {"rank0_cpu_ms": steady * 1e3, "first_rank0_cpu_ms": cpu[0] * 1e3,
            "requests_to_rank0": sum(len(c.to_rank0) for c in tape if c.step == steps - 1), "rounds": rounds,
            "bytes_per_rank": rounds * width, "critical_path_s": steady}


def replay_rank0(tape: List[Cycle], ranks: int, tensors: int, steps: int) -> List[float]:
    """Rank 0's CPU per step: its cycle state and its coordinator, fed what it received in the simulation."""
    from ddp_train.horovod_api.coordinator import frames
    from ddp_train.horovod_api.cycle import RankCycle
    from ddp_train.horovod_api.negotiation import Negotiator, Outgoing
    from ddp_train.horovod_api.settings import Settings

    settings = Settings()
    core = Negotiator(ranks, settings, broadcast=True)
    state = RankCycle(settings.cache_capacity, 0.0, settings.fusion_threshold)
    everyone = list(range(ranks))
    cpu = [0.0] * steps
    mine: Dict[str, Any] = {}
    for cycle in tape:
        requests = requests_of(0, tensors, False) if cycle.first else []
        if cycle.first:
            mine = {r.name: r for r in requests}
        started = time.thread_time()
        for request in requests:
            state.ask(request)
        words = state.vector(0.0)
        fmt = f"<{len(words)}Q"
        state.take_outgoing()  # what it sends its own coordinator is among cycle.to_rank0
        for request in cycle.to_rank0:
            core.request(request, 0.0)
        if core.due(0.0):
            core.answer()
        out = core.take()
        frames(out, everyone)
        for item in out:
            if isinstance(item, Outgoing):
                for response in item.responses:
                    if response.seq:
                        state.hold(response)
        for partner in cycle.partners:
            struct.pack(fmt, *words)  # what it sends this round
            words = [a & b for a, b in zip(words, struct.unpack(fmt, partner), strict=True)]
        plan = state.settle(words)
        for response in plan.responses:
            state.ran(response, mine)
        state.take_outgoing()
        cpu[cycle.step] += time.thread_time() - started
    return cpu


def simulate(ranks: int, tensors: int, steps: int, latency_s: float) -> List[Dict[str, Any]]:
    """Both protocols at one N and T."""
    rows = []
    for cache, measure in (("off", cache_off), ("on", cache_on)):
        row = measure(ranks, tensors, steps)
        trips = 2 if cache == "off" else row["rounds"]
        row["wall_ms"] = (row.pop("critical_path_s") + trips * latency_s) * 1e3
        rows.append({"mode": "simulated", "cache": cache, "ranks": ranks, "tensors": tensors, **row})
        print(f"simulated N={ranks:5d} T={tensors:5d} cache {cache:3s}: rank 0 {row['rank0_cpu_ms']:9.3f} ms CPU, "
              f"wall {row['wall_ms']:9.3f} ms, first step {row['first_rank0_cpu_ms']:9.1f} ms", flush=True)
    return rows


# --- real processes ---------------------------------------------------------------------------------------------
def worker(args: Namespace) -> int:
    """One rank under torchrun: the coordinator on rank 0, requests over real sockets, the agreement over Gloo."""
    import torch
    import torch.distributed as dist

    from ddp_train.horovod_api import coordinator as coordination
    from ddp_train.horovod_api.cycle import RankCycle
    from ddp_train.horovod_api.execute import Communicator, agree
    from ddp_train.horovod_api.messages import Channel, read_responses, requests_message
    from ddp_train.horovod_api.settings import Settings

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    cache = args.cache == "on"
    settings = Settings(cache_capacity=1024 if cache else 0)
    address: List[Any] = [None]
    if rank == 0:
        listener = coordination.listen(single_host=True)
        coordination.Coordinator(listener, size, settings, broadcast=cache).start()
        address = ["%s:%d" % listener.getsockname()[:2]]
    dist.broadcast_object_list(address, src=0)
    host, port = str(address[0]).rsplit(":", 1)
    channel = Channel(socket.create_connection((host, int(port))))
    channel.send({"type": "hello", "rank": rank})
    state = RankCycle(settings.cache_capacity)
    lock = threading.Condition()
    arrived: List[str] = []

    def read() -> None:
        while True:
            message = channel.recv()
            if message is None:
                return
            if message["type"] != "responses":
                continue
            with lock:
                for response in read_responses(message):
                    if cache:
                        state.hold(response)
                    else:
                        arrived.extend(response.names)
                lock.notify_all()

    threading.Thread(target=read, daemon=True).start()
    comm = Communicator(list(range(size)), rank, dist.new_group(backend="gloo"))
    tensors = int(args.tensors)
    times = []
    for step in range(int(args.steps)):
        requests = requests_of(rank, tensors, checked=step > 0 and not cache)
        dist.barrier()
        started = time.perf_counter()
        if not cache:
            for request in requests:  # one frame per gradient, as DistributedOptimizer's hooks ask
                channel.send(requests_message([request]))
            with lock:
                while len(arrived) < tensors:
                    lock.wait()
                arrived.clear()
        else:
            done = 0
            with lock:
                direct = [r for r in requests if not state.ask(r)]
            if direct:
                channel.send(requests_message(direct))
            while done < tensors:
                with lock:
                    if not state.has_work():
                        lock.wait(0.01)
                    words = state.vector(time.monotonic())
                    outgoing = state.take_outgoing()
                if outgoing:
                    channel.send(requests_message(outgoing))
                agreed = agree(comm, words, lambda: False)
                assert agreed is not None
                with lock:
                    plan = state.settle(agreed)
                    for response in plan.responses:
                        state.ran(response, {r.name: r for r in requests})
                    later = state.take_outgoing()
                if later:
                    channel.send(requests_message(later))
                done += plan.tensors()
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    if rank == 0:
        Path(args.result).write_text(json.dumps({"times_s": times}))
    dist.barrier()
    channel.send({"type": "bye"})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Simulate every N, then run the real ones (or be one rank, with --worker)."""
    p = parser("negotiation", __doc__)
    p.add_argument("--np", type=world_sizes, default=[2, 8, 64, 256, 1024], help="simulated world sizes")
    p.add_argument("--tensors", type=csv_list(int, minimum=1), default=[161, 1000], help="tensors a step")
    p.add_argument("--steps", type=int, default=4, help="steps per measurement; the first is reported apart")
    p.add_argument("--real-np", type=world_sizes, default=[2, 4, 8, 16], help="world sizes run as processes")
    p.add_argument("--real-steps", type=int, default=12, help="steps per real run")
    add_out(p)
    add_worker(p, "--cache", "--real-tensors")
    args = p.parse_args(argv)
    if args.worker:
        return worker(Namespace(cache=args.cache, tensors=args.real_tensors, steps=args.real_steps,
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
            for cache in ("off", "on"):
                data = workers.run(f"real-{ranks}-{tensors}-{cache}", "torchrun", ranks, "benchmarks.negotiation",
                                   ["--worker", "--cache", cache, "--real-tensors", str(tensors), "--real-steps",
                                    str(args.real_steps)], ranks=ranks, tensors=tensors, cache=cache)
                if data is None:
                    continue
                times = data["times_s"]
                row = {"mode": "real", "cache": cache, "ranks": ranks, "tensors": tensors,
                       "wall_ms": statistics.median(times[1:]) * 1e3, "first_wall_ms": times[0] * 1e3,
                       "times_s": times}
                rows.append(row)
                print(f"real      N={ranks:5d} T={tensors:5d} cache {cache:3s}: wall {row['wall_ms']:9.3f} ms, "
                      f"first step {row['first_wall_ms']:9.1f} ms", flush=True)
    return workers.publish(settings={"np": args.np, "tensors": args.tensors, "steps": args.steps,
                                     "real_np": args.real_np, "real_steps": args.real_steps},
                           latency_s=latency, definitions=DEFINITIONS, target_rank0_ms=TARGET_RANK0_MS, rows=rows)


if __name__ == "__main__":
    sys.exit(run_cli(main, "negotiation"))
