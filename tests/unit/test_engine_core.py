"""Each rank's engine as a state machine (engine_core.py), without threads, sockets or torch: made-up streams of
submissions, rank 0's responses, agreements, guesses, joins, shutdowns and lost ranks, on one rank or on several
whose words are ANDed here as the agreement's collective would."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import pytest

from ddp_train.horovod_api import cycle as cycles
from ddp_train.horovod_api.engine_core import LONGEST_BURST, CycleStart, EngineCore, Run
from ddp_train.horovod_api.exceptions import SHUT_DOWN, HorovodInternalError
from ddp_train.horovod_api.messages import ALLGATHER, ALLREDUCE, ERROR, JOIN, Request, Response

F32 = "HOROVOD_FLOAT32"
CYCLE_S = 0.001
LOST = f"{SHUT_DOWN} (rank 1 exited or lost its connection to rank 0)"


@dataclass
class Part:
    """A part as the machine sees it; `got` stands for the handle the shell would hand the result to."""

    request: Request
    got: Optional[str] = None


def part(rank: int, name: str, kind: str = ALLREDUCE, gen: int = 0, shape=(4,)) -> Part:
    return Part(Request(rank, gen, 0, name, kind, dtype=F32, shape=list(shape)))


def machine(size: int, capacity: int = 1024) -> EngineCore[Part]:
    return EngineCore(cycles.RankCycle(capacity), size, CYCLE_S)


def allreduce(seq: int, names: List[str], gen: int = 0) -> Response:
    return Response(seq, gen, 0, ALLREDUCE, names, dtype=F32, shapes=[[4]] * len(names))


class Job:
    """Several ranks' machines; a cycle starts on each, reduces the guess's flag (the sum of the ranks' 1s), else
    ANDs their words, then settles and runs what each was told (the shell's work, without data)."""

    def __init__(self, size: int, capacity: int = 1024) -> None:
        self.ranks = [machine(size, capacity) for _ in range(size)]
        self.seq = 0
        self.agreements = 0  # the agreement's collectives run
        self.to_rank0: List[Request] = []

    def submit(self, names: List[str], ranks: Optional[List[int]] = None) -> Dict[int, List[Part]]:
        parts = {}
        for rank in ranks if ranks is not None else range(len(self.ranks)):
            parts[rank] = [part(rank, name) for name in names]
            self.to_rank0 += self.ranks[rank].submit(parts[rank], now=0.0).to_rank0
        return parts

    def answer(self, names: List[str]) -> None:
        """Rank 0's fused response to every rank (the cache is on: every rank hears every numbered response)."""
        self.seq += 1
        for core in self.ranks:
            core.receive(allreduce(self.seq, names))

    def cycle(self) -> List[List[Run[Part]]]:
        starts = [core.start(now=1.0) for core in self.ranks]
        assert all(start is not None for start in starts)
        agreed = self.agreed([s for s in starts if s is not None])
        every = []
        for core in self.ranks:
            runs = core.settle(agreed)
            for run in runs:
                for p in run.parts:
                    if p is not None:
                        p.got = "guessed" if run.ahead is not None else "ran"
                core.ran(run)
            self.to_rank0 += core.end(now=1.0).to_rank0
            every.append(runs)
        return every

    def agreed(self, starts: List[CycleStart[Part]]) -> List[int]:
        if starts[0].guess is not None:
            count = sum(1.0 for s in starts if s.matched)  # what the guess's allreduce sums
            known = [core.after_guess(count) for core in self.ranks]
            if known[0] is not None:
                return known[0]
        self.agreements += 1
        return cycles.band([s.words for s in starts])

    def steady(self, names: List[str]) -> None:
        """A first step (rank 0 negotiates, every rank caches), then one step agreed from the cache: the next
        cycle guesses it."""
        self.submit(names)
        self.cycle()  # looked up: misses, sent to rank 0
        self.answer(names)
        self.cycle()  # rank 0's response runs and is cached
        self.submit(names)
        self.cycle()  # agreed from the cache: now the guess


# --- the guess ---------------------------------------------------------------------------------------------------
def test_a_steady_step_is_one_round_when_every_rank_asked_for_the_guess():
    job = Job(4)
    job.steady(["allreduce.a", "allreduce.b"])
    before, sent = job.agreements, len(job.to_rank0)
    parts = job.submit(["allreduce.b", "allreduce.a"])  # in another order: the same vector
    runs = job.cycle()
    assert job.agreements == before  # the guess's sums answered the agreement: no collective of its own
    assert len(job.to_rank0) == sent  # and rank 0 heard nothing
    assert [[r.response.names for r in rank] for rank in runs] == [[["allreduce.a", "allreduce.b"]]] * 4
    assert all(r.ahead == 0 for rank in runs for r in rank)
    assert all(p.got == "guessed" for ps in parts.values() for p in ps)


def test_a_missed_guess_falls_back_to_the_agreement_and_drops_the_guessed_sums():
    job = Job(3)
    job.steady(["allreduce.a", "allreduce.b"])
    before = job.agreements
    job.submit(["allreduce.a", "allreduce.b"], ranks=[0, 1])
    job.submit(["allreduce.a"], ranks=[2])  # rank 2 has not asked for b yet: its vector is another
    runs = job.cycle()
    assert job.agreements == before + 1
    assert [[r.response.names for r in rank] for rank in runs] == [[["allreduce.a"]]] * 3
    assert all(r.ahead is None for rank in runs for r in rank)  # agreed on less than the guess: run again
    job.submit(["allreduce.b"], ranks=[2])
    runs = job.cycle()
    assert [[r.response.names for r in rank] for rank in runs] == [[["allreduce.b"]]] * 3


def test_what_a_rank_puts_into_the_guess_is_its_parts_and_zeros_for_the_rest():
    job = Job(2)
    job.steady(["allreduce.a", "allreduce.b"])
    mine = job.ranks[1].submit([part(1, "allreduce.b")], now=2.0)
    assert mine.to_rank0 == []
    start = job.ranks[1].start(now=2.0)
    assert start is not None and start.guess is not None and not start.matched
    (fused,) = start.guess_parts
    assert fused[0] is None and fused[1] is not None and fused[1].request.name == "allreduce.b"


# --- when a cycle starts ----------------------------------------------------------------------------------------
def test_a_burst_is_gathered_until_it_pauses_a_waiting_thread_or_the_longest_burst():
    core = machine(2)
    assert core.due(now=0.0) is None and core.idle  # nothing to do: wait for an input
    assert core.submit([part(0, "allreduce.a")], now=5.0).wake  # an idle thread is woken once
    assert core.due(now=5.0) == pytest.approx(5.0 + CYCLE_S)
    assert not core.submit([part(0, "allreduce.b")], now=5.0005).wake  # no wake-up per tensor
    assert core.due(now=5.0008) == pytest.approx(5.0005 + CYCLE_S)
    for i in range(3 * LONGEST_BURST):  # the script keeps asking: the cycle runs at the longest burst
        core.submit([part(0, f"allreduce.c{i}")], now=5.0 + i * CYCLE_S / 2)
    assert core.due(now=5.01) == pytest.approx(5.0 + LONGEST_BURST * CYCLE_S)
    core.awaited(1)
    assert core.due(now=5.01) == 5.01


def test_a_cycle_that_ran_nothing_rests_a_cycle_time_unless_a_response_arrives():
    core = machine(2)
    core.submit([part(0, "allreduce.a")], now=0.0)
    start = core.start(now=1.0)
    assert start is not None
    assert core.settle(start.words) == []
    core.end(now=1.0)
    assert core.due(now=1.0) == pytest.approx(1.0 + CYCLE_S)
    core.receive(allreduce(1, ["allreduce.a"]))
    assert core.due(now=1.0) == 1.0  # rank 0's responses run at once


# --- joins --------------------------------------------------------------------------------------------------------
def test_a_joined_rank_takes_part_in_cycles_and_the_others_cached_requests_go_to_rank_0():
    job = Job(3)
    job.steady(["allreduce.g"])
    join = part(2, "join.noname", kind=JOIN)
    joined = job.ranks[2].submit([join], now=3.0)
    assert [r.kind for r in joined.to_rank0] == [JOIN]
    assert job.ranks[2].due(now=3.0) is not None  # it cycles while joined, though it asks for nothing
    job.submit(["allreduce.g"], ranks=[0, 1])
    sent = len(job.to_rank0)
    runs = job.cycle()
    assert all(r == [] for r in runs)  # a rank has joined: the hit is not run from the cache ...
    assert sorted(r.rank for r in job.to_rank0[sent:]) == [0, 1]  # ... it goes to rank 0, which adds zeros
    job.seq += 1
    for core in job.ranks:
        core.receive(Response(job.seq, 0, 0, JOIN, ["join.noname"], joining=2))
    runs = job.cycle()
    assert [r.response.kind for r in runs[2]] == [JOIN] and runs[2][0].parts == [join]
    assert not job.ranks[2].cycle.joined and job.ranks[2].due(now=4.0) is None


# --- shutdown and lost ranks ----------------------------------------------------------------------------------------
def test_a_shutdown_while_the_guess_reduces_lets_its_parts_complete():
    """The race: a faster rank finished the guessed sums, handed out its results and shut down; rank 0's word that
    the generation closed reaches this rank while it still waits in those very sums, which every rank completed.
    They must complete here too, not fail; what the cycle does not reduce fails at once."""
    job = Job(2)
    job.steady(["allreduce.a", "allreduce.b"])
    fast, slow = job.ranks
    fast_parts = [part(0, "allreduce.a"), part(0, "allreduce.b")]
    fast.submit(fast_parts, now=2.0)
    slow_parts = [part(1, "allreduce.a"), part(1, "allreduce.b")]
    other = part(1, "allgather.x", kind=ALLGATHER)  # not cached: it went to rank 0, and waits there
    slow.submit([*slow_parts, other], now=2.0)
    starts = [fast.start(now=2.0), slow.start(now=2.0)]
    assert all(s is not None and s.guess is not None and s.matched for s in starts)
    # the sums complete on both ranks (the flags sum to 2); the fast rank runs its cycle to the end and leaves
    agreed = fast.after_guess(2.0)
    assert agreed is not None
    (run,) = fast.settle(agreed)
    fast.ran(run)
    fast.end(now=2.0)
    assert run.parts == fast_parts
    failed = slow.close(gen=0)  # rank 0 tells every rank the generation closed; the slow rank still waits
    assert [f.part for f in failed] == [other]
    agreed = slow.after_guess(2.0)
    assert agreed is not None
    (run,) = slow.settle(agreed)
    assert run.parts == slow_parts and run.ahead == 0 and slow.refusal(run) is None
    slow.ran(run)
    assert slow.end(now=2.0).failures == []


def test_a_guessed_part_the_cycle_did_not_run_fails_once_the_cycle_ends_after_a_shutdown():
    job = Job(2)
    job.steady(["allreduce.a", "allreduce.b"])
    slow = job.ranks[1]
    parts = [part(1, "allreduce.a"), part(1, "allreduce.b")]
    slow.submit(parts, now=2.0)
    start = slow.start(now=2.0)
    assert start is not None and start.matched
    assert slow.close(gen=0) == []
    other = job.ranks[0].cycle
    other.waiting.clear()  # the other rank asked for nothing: the agreement agrees on nothing
    assert slow.after_guess(1.0) is None
    assert slow.settle(cycles.band([start.words, other.vector(2.0)])) == []
    assert [f.part for f in slow.end(now=2.0).failures] == parts


def test_a_lost_rank_fails_what_waits_and_the_engine_stops():
    core = machine(2)
    waiting = [part(0, "allreduce.a"), part(0, "broadcast.b", kind="BROADCAST")]
    core.submit(waiting, now=0.0)
    failed = core.lose(LOST)
    assert [(f.part, f.message) for f in failed] == [(p, LOST) for p in waiting]
    assert core.due(now=1.0) == 1.0 and core.start(now=1.0) is None  # the cycle thread ends
    with pytest.raises(HorovodInternalError, match="rank 1 exited"):
        core.submit([part(0, "allreduce.c")], now=1.0)


def test_a_lost_rank_mid_cycle_lets_the_guessed_sums_finish_and_refuses_the_rest():
    job = Job(2)
    job.steady(["allreduce.a"])
    core = job.ranks[0]
    mine = part(0, "allreduce.a")
    core.submit([mine], now=2.0)
    core.receive(allreduce(job.seq + 1, ["allreduce.z"]))  # a response of rank 0 in the same cycle
    start = core.start(now=2.0)
    assert start is not None and start.guess is not None
    assert core.lose(LOST) == []  # the guess reduces it
    runs = core.settle(start.guess.expected[:1] + (1,) + start.guess.expected[2:])  # the guess's hits + one held
    assert [r.response.names for r in runs] == [["allreduce.a"], ["allreduce.z"]]
    assert core.refusal(runs[0]) is None and core.refusal(runs[1]) == LOST


# --- the cache off: the same machine ------------------------------------------------------------------------------
def test_with_the_cache_off_every_request_goes_to_rank_0_and_its_responses_run_in_their_order():
    core = machine(3, capacity=0)
    parts = [part(1, "allreduce.a"), part(1, "allreduce.b")]
    submitted = core.submit(parts, now=0.0)
    assert [r.name for r in submitted.to_rank0] == ["allreduce.a", "allreduce.b"] and not submitted.wake
    assert core.due(now=0.0) is None  # nothing to agree on: the thread waits for rank 0
    core.receive(allreduce(7, ["allreduce.b"]))  # numbered among every rank's responses: this rank's skip some
    core.receive(allreduce(9, ["allreduce.a"]))
    assert core.due(now=0.0) == 0.0
    start = core.start(now=0.0)
    assert start is not None and not start.agree and start.guess is None
    runs = core.settle(start.words)  # its own words are the agreement
    assert [r.parts for r in runs] == [[parts[1]], [parts[0]]]
    for run in runs:
        core.ran(run)
    assert core.end(now=0.0).to_rank0 == [] and core.due(now=0.0) is None


def test_an_error_of_rank_0_fails_what_it_names_at_once_and_a_response_received_runs_after_a_shutdown():
    core = machine(2, capacity=0)
    mismatched, kept = part(0, "allreduce.x"), part(0, "allreduce.y")
    core.submit([mismatched, kept], now=0.0)
    failed = core.receive(Response(0, 0, 0, ERROR, ["allreduce.x"], error="Mismatched ALLREDUCE tensor shapes"))
    assert [(f.part, f.message) for f in failed] == [(mismatched, "Mismatched ALLREDUCE tensor shapes")]
    core.receive(allreduce(3, ["allreduce.y"]))
    assert [f.part for f in core.close(gen=0)] == [kept]  # it fails here ...
    assert not core.finished(0)
    start = core.start(now=0.0)
    assert start is not None
    (run,) = core.settle(start.words)
    assert run.parts == [None]  # ... and its response still runs, with a stand-in: the other ranks take part in it
    core.ran(run)
    assert core.finished(0)
