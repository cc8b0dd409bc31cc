"""The negotiation of the Horovod API without sockets, threads or torch: rank 0's negotiation (order, fusion, join,
errors, stalls, lost ranks) and every rank's side of the response cache (hits agreed by a bitwise AND, invalidation,
eviction, joins), on made-up request streams from many ranks."""

from __future__ import annotations

from typing import Dict, List, Optional

import pytest

from ddp_train.horovod_api import cycle as cycles
from ddp_train.horovod_api.exceptions import SHUT_DOWN
from ddp_train.horovod_api.messages import ALLGATHER, ALLREDUCE, BARRIER, BROADCAST, ERROR, JOIN, Request, Response
from ddp_train.horovod_api.negotiation import Closed, Negotiator, Outgoing, fuse_allreduces
from ddp_train.horovod_api.settings import Settings

F32 = "HOROVOD_FLOAT32"


def ask(rank: int, name: str, kind: str = ALLREDUCE, shape=(4,), gen: int = 0, **fields) -> Request:
    return Request(rank, gen, 0, name, kind, dtype=F32, shape=list(shape), **fields)


def responses_for(out: List[object], rank: int) -> List[Response]:
    """The responses a rank receives, in order."""
    got = []
    for item in out:
        if isinstance(item, Outgoing) and (item.ranks is None or rank in item.ranks):
            got.extend(item.responses)
    return got


def negotiator(size: int, broadcast: bool = False, **settings) -> Negotiator:
    return Negotiator(size, Settings(**settings), broadcast=broadcast)


# --- rank 0's negotiation ---------------------------------------------------------------------------------------
def test_a_collective_runs_once_every_rank_asked_in_any_order():
    core = negotiator(64)
    for rank in reversed(range(63)):
        core.request(ask(rank, "allreduce.a"), now=0.0)
    assert not core.ready and not core.take()
    core.request(ask(63, "allreduce.a"), now=0.0)
    assert core.due(now=0.0)  # nothing else asked for: no reason to wait out the cycle
    core.answer()
    out = core.take()
    assert [r.names for r in responses_for(out, 5)] == [["allreduce.a"]]
    assert all(item.ranks == list(range(64)) for item in out if isinstance(item, Outgoing))


def test_allreduces_complete_in_one_cycle_fuse_up_to_the_threshold_in_order():
    core = negotiator(8, fusion_threshold=3 * 64)  # 64 bytes each (16 floats): three per buffer
    for name in "abcde":
        for rank in range(8):
            core.request(ask(rank, f"allreduce.{name}", shape=(16,)), now=0.0)
    core.request(ask(0, "allreduce.late"), now=0.0)
    assert not core.due(now=0.0005)  # a collective still incomplete may fuse with them within the cycle
    assert core.due(now=0.002)
    core.answer()
    got = responses_for(core.take(), 3)
    assert [r.names for r in got] == [["allreduce.a", "allreduce.b", "allreduce.c"], ["allreduce.d", "allreduce.e"]]
    assert [r.seq for r in got] == [1, 2]


def test_fusion_keeps_apart_what_cannot_share_a_buffer():
    def one(name: str, op: int = 1, dtype: str = F32) -> Response:
        return Response(0, 0, 0, ALLREDUCE, [name], dtype=dtype, op=op, shapes=[[4]])

    fused = fuse_allreduces([one("a"), one("b", op=2), one("c"), one("d", dtype="HOROVOD_FLOAT64")], 1 << 20)
    assert [r.names for r in fused] == [["a", "c"], ["b"], ["d"]]


def test_mismatched_requests_are_an_unnumbered_error_to_every_rank_that_asked():
    core = negotiator(3)
    for rank in range(3):
        core.request(ask(rank, "allreduce.x", shape=(3 + (rank == 2),)), now=0.0)
    core.answer()
    out = core.take()
    (error,) = responses_for(out, 2)
    assert error.kind == ERROR and error.seq == 0 and "Mismatched ALLREDUCE tensor shapes" in error.error


def test_a_joined_rank_adds_zeros_and_the_join_answers_with_the_last_rank():
    core = negotiator(4)
    core.request(ask(2, "join.noname", kind=JOIN), now=0.0)
    for rank in (0, 1, 3):
        core.request(ask(rank, "allreduce.g"), now=0.0)
    core.answer()
    (reduced,) = responses_for(core.take(), 0)
    assert reduced.names == ["allreduce.g"] and reduced.joined == [2]
    for rank in (3, 0, 1):
        core.request(ask(rank, "join.noname", kind=JOIN), now=0.0)
    (join,) = responses_for(core.take(), 2)
    assert join.kind == JOIN and join.joining == 1


def test_a_lost_rank_fails_what_needs_it_and_names_it():
    core = negotiator(8)
    for rank in range(6):
        core.request(ask(rank, "allreduce.w"), now=0.0)
    core.rank_gone(7, now=0.0)
    (error,) = responses_for(core.take(), 0)
    assert error.kind == ERROR and error.error.startswith(SHUT_DOWN) and "rank 7 exited" in error.error
    core.request(ask(0, "allreduce.next"), now=0.0)
    assert "rank 7" in responses_for(core.take(), 0)[0].error


def test_stalls_name_the_missing_ranks_then_close_the_generation():
    core = negotiator(4, stall_check_s=60, stall_shutdown_s=120)
    for rank in (0, 1):
        core.request(ask(rank, "allreduce.s"), now=0.0)
    assert core.stalls(now=30.0) is None
    report, shut = core.stalls(now=61.0)
    assert not shut and "Missing ranks:\n2: [allreduce.s]\n3: [allreduce.s]" in report
    report, shut = core.stalls(now=130.0)
    assert shut and "2!: [allreduce.s]" in report
    out = core.take()
    assert any(isinstance(item, Closed) and item.gen == 0 for item in out)
    assert all(r.kind == ERROR for r in responses_for(out, 0))


def test_with_the_cache_every_numbered_response_goes_to_every_rank_and_errors_to_those_that_asked():
    core = negotiator(3, broadcast=True)
    core.request(ask(0, "broadcast.b", kind=BROADCAST, root=0), now=0.0)
    core.request(ask(1, "broadcast.b", kind=BROADCAST, root=1), now=0.0)
    core.request(ask(2, "broadcast.b", kind=BROADCAST, root=0), now=0.0)
    for rank in range(3):
        core.request(ask(rank, "barrier.noname", kind=BARRIER), now=0.0)
    core.answer()
    out = [item for item in core.take() if isinstance(item, Outgoing)]
    assert [(item.ranks, item.responses[0].kind) for item in out] == [([0, 1, 2], ERROR), (None, BARRIER)]
    assert out[1].responses[0].seq == 1  # errors are not numbered: the ranks count the responses they run


# --- every rank's side of the response cache --------------------------------------------------------------------
class Ranks:
    """N ranks' cycle states and rank 0's negotiation, stepped together as the engines and coordinator step them."""

    def __init__(self, size: int, capacity: int = 1024, stall_s: float = 0.0) -> None:
        self.ranks = [cycles.RankCycle(capacity, stall_s) for _ in range(size)]
        self.core = negotiator(size, broadcast=True)
        self.ran: List[List[List[str]]] = [[] for _ in range(size)]
        self.to_rank0 = 0
        self.rounds = 0

    def ask(self, rank: int, request: Request) -> None:
        if not self.ranks[rank].ask(request):
            self._send([request])

    def _send(self, requests: List[Request]) -> None:
        self.to_rank0 += len(requests)
        for request in requests:
            self.core.request(request, now=0.0)
        if self.core.due(now=1.0):
            self.core.answer()
        for item in self.core.take():
            for rank, state in enumerate(self.ranks):
                for response in responses_for([item], rank):
                    if response.seq:
                        state.hold(response)

    def cycle(self, mine: Optional[Dict[int, Dict[str, Request]]] = None, now: float = 0.0) -> None:
        """One cycle on every rank: vectors, the AND, then what each rank runs."""
        self.rounds += 1
        vectors = [state.vector(now) for state in self.ranks]
        for state in self.ranks:
            self._send(state.take_outgoing())
        agreed = cycles.band(vectors)
        for rank, state in enumerate(self.ranks):
            plan = state.settle(agreed)
            ran = [r.names for r in plan.cached] + [r.names for r in plan.responses]
            self.ran[rank].append([name for names in ran for name in names])
            for response in plan.responses:
                requests = (mine or {}).get(rank, {})
                state.ran(response, {name: requests.get(name) for name in response.names})
        for state in self.ranks:
            self._send(state.take_outgoing())


def gradient_step(ranks: Ranks, names: List[str], shapes: Optional[Dict[int, tuple]] = None) -> Dict:
    mine: Dict[int, Dict[str, Request]] = {}
    for rank in range(len(ranks.ranks)):
        for name in names:
            request = ask(rank, name, kind=ALLGATHER if name.startswith("allgather") else ALLREDUCE,
                          shape=(shapes or {}).get(rank, (4,)) if name.startswith("allgather") else (4,))
            mine.setdefault(rank, {})[name] = request
            ranks.ask(rank, request)
    return mine


def first(ranks: Ranks, mine: Dict) -> None:
    """A first step: one cycle looks the requests up (and sends them to rank 0), the next runs rank 0's responses."""
    ranks.cycle(mine)
    ranks.cycle(mine)
    assert all(state.cache.entries for state in ranks.ranks)


def test_a_repeated_step_is_agreed_without_a_request_to_rank_0():
    ranks = Ranks(16)
    names = [f"allreduce.grad{i}" for i in range(10)]
    mine = gradient_step(ranks, names)
    ranks.cycle(mine)  # looked up: not cached, so sent to rank 0, whose responses reach every rank
    assert ranks.to_rank0 == 16 * 10
    ranks.cycle(mine)  # rank 0's responses, held by every rank, run and are cached
    assert all(ran[-1] == names for ran in ranks.ran)
    assert len(ranks.ranks[0].cache) == 10
    gradient_step(ranks, list(reversed(names)))  # asked in another order: run in the cache's order
    ranks.cycle()
    assert ranks.to_rank0 == 16 * 10
    assert all(ran[-1] == names for ran in ranks.ran)


def test_a_hit_waits_until_every_rank_asked():
    ranks = Ranks(4)
    first(ranks, gradient_step(ranks, ["allreduce.a", "allreduce.b"]))
    for rank in range(4):
        ranks.ask(rank, ask(rank, "allreduce.a"))
    for rank in range(3):
        ranks.ask(rank, ask(rank, "allreduce.b"))
    ranks.cycle()
    assert all(ran[-1] == ["allreduce.a"] for ran in ranks.ran)
    ranks.ask(3, ask(3, "allreduce.b"))
    ranks.cycle()
    assert all(ran[-1] == ["allreduce.b"] for ran in ranks.ran)


def test_an_allgather_whose_size_changes_invalidates_its_entry_on_every_rank():
    ranks = Ranks(3)
    first(ranks, gradient_step(ranks, ["allgather.preds"], shapes={0: (3, 2), 1: (3, 2), 2: (3, 2)}))
    mine = gradient_step(ranks, ["allgather.preds"], shapes={0: (3, 2), 1: (3, 2), 2: (1, 2)})
    sent = ranks.to_rank0
    ranks.cycle(mine)  # rank 2 invalidates; ranks 0 and 1 send theirs to rank 0 once every rank erased it
    assert len(ranks.ranks[0].cache) == 0 and ranks.to_rank0 == sent + 3
    ranks.cycle(mine)
    assert len(ranks.ranks[0].cache) == 1
    assert all(ran[-1] == ["allgather.preds"] for ran in ranks.ran)
    entry = ranks.ranks[0].cache.entries[(0, "allgather.preds")]
    assert entry.response.sizes == [[3, 3, 1]]


def test_a_join_sends_the_others_cached_requests_to_rank_0_which_adds_zeros():
    ranks = Ranks(3)
    first(ranks, gradient_step(ranks, ["allreduce.g"]))
    ranks.ask(2, ask(2, "join.noname", kind=JOIN))
    ranks.ranks[2].joined = True
    for rank in (0, 1):
        ranks.ask(rank, ask(rank, "allreduce.g"))
    ranks.cycle()  # the join is seen: ranks 0 and 1 send allreduce.g to rank 0
    ranks.cycle()
    assert ranks.ranks[0].cache.entries[(0, "allreduce.g")].response.joined == []  # not the zeros' response
    assert [ran[-1] for ran in ranks.ran] == [["allreduce.g"]] * 3


def test_eviction_is_least_recently_used_and_the_same_on_every_rank():
    ranks = Ranks(2, capacity=2)
    first(ranks, gradient_step(ranks, ["allreduce.a", "allreduce.b"]))
    gradient_step(ranks, ["allreduce.a"])
    ranks.cycle()  # a is now the most recently used
    first(ranks, gradient_step(ranks, ["allreduce.c"]))
    for state in ranks.ranks:
        assert [key[1] for key in state.cache.entries] == ["allreduce.a", "allreduce.c"]
        assert state.cache.bits == 2


def test_a_stalled_hit_goes_to_rank_0_whose_stall_inspector_names_the_missing_rank():
    ranks = Ranks(2, stall_s=60)
    first(ranks, gradient_step(ranks, ["allreduce.s"]))
    ranks.ask(0, ask(0, "allreduce.s"))
    ranks.cycle(now=1.0)
    assert ranks.core.pending == {}
    ranks.cycle(now=62.0)  # past the stall check: invalidated, and sent to rank 0
    ranks.cycle(now=62.0)
    assert (0, 0, "allreduce.s") in ranks.core.pending
    report, _ = ranks.core.stalls(now=200.0)
    assert "1: [allreduce.s]" in report


def test_the_agreement_vector_is_small_and_the_same_length_on_every_rank():
    words = cycles.pack(False, 3, [0, 70], [5], bits=161)
    assert len(words) == 2 + 2 * 3
    other = cycles.pack(True, 1, [70], [], bits=161)
    agreement = cycles.unpack(cycles.band([words, other]), bits=161)
    assert agreement.hits == [70] and agreement.invalid == [5] and agreement.responses == 1 and agreement.joined
    assert cycles.to_unsigned(cycles.to_signed(words)) == words


@pytest.mark.parametrize("held", [0, 1, 63, 64, 100])
def test_responses_held_count_as_the_fewest_any_rank_holds(held):
    words = cycles.pack(False, held, [], [], bits=0)
    assert cycles.unpack(words, 0).responses == min(held, cycles.RESPONSES_PER_CYCLE)


def test_the_benchmark_drives_every_ranks_engine_and_times_rank_0_alone():
    from benchmarks import negotiation as bench

    off, agreement, guess = bench.simulate(8, 16, 2, latency_s=1e-5)
    assert [off["path"], agreement["path"], guess["path"]] == ["off", "agreement", "guess"]
    assert off["requests_to_rank0"] == 8 * 16 and off["rounds"] == 2
    # with the cache a steady step sends rank 0 nothing; the agreement is log2(8) rounds of a 4-word vector, then
    # the sums: two allreduces
    assert agreement["requests_to_rank0"] == 0 and agreement["rounds"] == 3
    assert agreement["bytes_per_rank"] == 3 * 8 * (cycles.HEADER_WORDS + 2) and agreement["collectives"] == 2
    # the guess: the sums alone, with a 4-byte flag in each of their rounds; no agreement
    assert guess["guessed_cycles"] == 1 and guess["agreed_cycles"] == 0 and guess["collectives"] == 1
    assert guess["rounds"] == 0 and guess["bytes_per_rank"] == 3 * bench.FLAG_BYTES
    assert 0 < guess["rank0_cpu_ms"] < off["rank0_cpu_ms"]


# --- the guess: a repeated step's sums before its agreement -----------------------------------------------------
def steady(ranks: Ranks, names: List[str], **fields) -> None:
    """A first step, then one step run from the cache."""
    mine: Dict[int, Dict[str, Request]] = {}
    for rank in range(len(ranks.ranks)):
        for name in names:
            request = ask(rank, name, **fields)
            mine.setdefault(rank, {})[name] = request
            ranks.ask(rank, request)
    first(ranks, mine)
    for rank in range(len(ranks.ranks)):
        for name in names:
            ranks.ask(rank, ask(rank, name, **fields))
    ranks.cycle()


def test_a_repeated_step_is_guessed_alike_on_every_rank_and_its_vectors_are_the_expected_ones():
    ranks = Ranks(8)
    names = ["allreduce.a", "allreduce.b", "allreduce.c"]
    steady(ranks, names)
    guesses = [state.guess() for state in ranks.ranks]
    assert guesses[0] is not None and all(g == guesses[0] for g in guesses)
    assert [r.names for r in guesses[0].fused] == [names]  # fused as the cycle fused them
    for rank in range(8):
        for name in reversed(names):  # in another order
            ranks.ask(rank, ask(rank, name))
    vectors = [state.vector(0.0) for state in ranks.ranks]
    assert all(tuple(v) == guesses[0].expected for v in vectors)
    assert tuple(cycles.band(vectors)) == guesses[0].expected  # what the agreement would have said
    plan = ranks.ranks[0].settle(guesses[0].expected)
    assert plan.hits == guesses[0].hits and [r.names for r in plan.cached] == [names]


def test_a_rank_that_asked_for_less_or_more_has_another_vector():
    ranks = Ranks(3)
    steady(ranks, ["allreduce.a", "allreduce.b"])
    expected = ranks.ranks[0].guess().expected
    ranks.ask(0, ask(0, "allreduce.a"))
    ranks.ask(1, ask(1, "allreduce.a"))
    ranks.ask(1, ask(1, "allreduce.b"))
    assert tuple(ranks.ranks[0].vector(0.0)) != expected  # b not yet asked
    assert tuple(ranks.ranks[1].vector(0.0)) == expected


@pytest.mark.parametrize("fields, why", [
    ({"op": 4}, "a maximum is not a sum"),
    ({"shape": (300_000,)}, "more than GUESS_BYTES"),
])
def test_only_small_sums_are_guessed(fields, why):
    ranks = Ranks(2)
    steady(ranks, ["allreduce.a"], **fields)
    assert all(state.guess() is None for state in ranks.ranks), why


def test_no_guess_once_the_cache_changed_or_a_rank_joined():
    ranks = Ranks(3)
    steady(ranks, ["allreduce.a"])
    assert ranks.ranks[0].guess() is not None
    first(ranks, gradient_step(ranks, ["allreduce.new"]))  # a new entry: the cache changed
    assert all(state.guess() is None for state in ranks.ranks)
    ranks = Ranks(3)
    steady(ranks, ["allreduce.a"])
    ranks.ask(2, ask(2, "join.noname", kind=JOIN))
    ranks.ranks[2].joined = True
    for rank in (0, 1):
        ranks.ask(rank, ask(rank, "allreduce.a"))
    ranks.cycle()
    assert all(state.guess() is None for state in ranks.ranks)
