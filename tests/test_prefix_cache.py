"""vLLM's automatic prefix caching in the engine: the cache rules, one at a time, on hand-made
traces (one second per iteration), then invariants under random traces, configs and
decisions (hypothesis). Conformance with vLLM's own scheduler is in
``tests/test_vllm_conformance.py``."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgym.engine import Decision, Engine, Status
from cbgym.engine import layout as L
from cbgym.engine import prefix_cache as pc
from cbgym.simulate import collect
from cbgym.workload.trace import Trace
from tests.conftest import UNIT_COST, make_config
from tests.test_engine_invariants import random_decision

BS = 16


def trace_of(rows: list[tuple[float, int, int, tuple[int, ...]]], block: int = BS,
             tenant: list[int] | None = None) -> Trace:
    """(arrival, prompt, output, ids) rows; ids one per ``block`` prompt tokens."""
    ids = np.empty(len(rows), dtype=object)
    ids[:] = [r[3] for r in rows]
    return Trace.from_arrays([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                             tenant=tenant, rebase=False,
                             extra={"hash_ids": ids, "hash_block_tokens": [block] * len(rows)})


def engine_for(trace: Trace, blocks: int = 200, **kw: object) -> Engine:
    kw.setdefault("max_num_batched_tokens", 512)
    cfg = make_config(cost_model=UNIT_COST, num_kv_blocks=blocks, block_size=BS,
                      enable_prefix_caching=True, **kw)
    return Engine(trace, cfg, record_iterations=True)


def drain(engine: Engine, rng: np.random.Generator | None = None) -> Engine:
    while (dp := engine.next_decision()) is not None:
        check_pool(engine)
        engine.decide(random_decision(dp, rng) if rng is not None else Decision())
        check_pool(engine)
    check_pool(engine)
    return engine


def check_pool(engine: Engine) -> None:
    """Every structure of the named pool agrees with every other."""
    s, nb = engine.state, engine.config.num_kv_blocks
    b = s.blocks
    ref = np.zeros(nb, np.int64)
    for rid in range(s.req.shape[1]):
        base, held = s.req[L.TABLE, rid], s.req[L.HELD, rid]
        blocks = s.tables[0, base: base + held]
        assert (blocks >= 0).all() and len(set(blocks.tolist())) == held
        np.add.at(ref, blocks, 1)
        assert s.req[L.N_CACHED, rid] <= held
        for j in range(s.req[L.N_CACHED, rid]):  # held cached blocks keep their hash
            k = blocks[j]
            assert b[L.B_HASHED, k] and b[L.B_HASH, k] == s.tables[1, base + j]
    assert (b[L.B_REF, :nb] == ref).all(), "references differ from the block tables"
    free = engine.kv.free
    assert 0 <= free <= nb and free == int((ref == 0).sum())
    assert pc.in_use(s) + free == nb
    queue, k = [], b[L.B_NEXT, nb]
    while k != nb:
        queue.append(k)
        assert b[L.B_PREV, b[L.B_NEXT, k]] == k
        k = b[L.B_NEXT, k]
    assert len(queue) == free and all(ref[q] == 0 for q in queue)
    mapped = 0
    for i in np.flatnonzero(s.cache[1] >= 0):
        h, k = s.cache[0, i], s.cache[1, i]
        assert pc.cached_block(s, h) == k, "a map entry its probe cannot reach"
        while k >= 0:
            assert b[L.B_HASHED, k] and b[L.B_HASH, k] == h
            mapped += 1
            k = b[L.B_SAME, k]
    assert mapped == int(b[L.B_HASHED, :nb].sum()), "a cached block missing from the map"


def free_queue(engine: Engine) -> list[int]:
    b, nb = engine.state.blocks, engine.config.num_kv_blocks
    out, k = [], b[L.B_NEXT, nb]
    while k != nb:
        out.append(int(k))
        k = b[L.B_NEXT, k]
    return out


# ------------------------------------------------------------------ the rules
def test_shared_prefix_is_found_and_counted() -> None:
    # 3 full shared blocks, then each its own partial block
    e = drain(engine_for(trace_of([(0, 50, 3, (1, 2, 3, 4)), (5, 60, 3, (1, 2, 3, 9))])))
    assert e.req.cached_tokens.tolist() == [0, 48]
    assert e.prefix_cache_stats["queries"] == 110 and e.prefix_cache_stats["hits"] == 48
    # the hit is computed, not recomputed: request 1's first iteration schedules 12 tokens
    log, _ = e.recorder.batch_log()
    assert [tuple(r) for r in log if r[1] == 1][0][2] == 12


def test_cached_free_blocks_count_as_free_and_a_hit_takes_them_out() -> None:
    e = engine_for(trace_of([(0, 64, 1, (1, 2, 3, 4)), (10, 64, 1, (1, 2, 3, 4))]), blocks=20)
    drain(e)
    assert e.kv.free == 20  # all back, yet cached: usage 0 as vLLM's kv_cache_usage_perc
    assert e.req.cached_tokens[1] == 48  # the last block recomputed (the last-token cap)
    ts = e.recorder.timeseries()
    # request 1 takes its 3 cached blocks from the free queue and 1 new one (+1 to decode)
    assert ts[ts[:, 0] == 10][0, 4] == 4


def test_last_token_cap() -> None:
    rows = [(0, 32, 1, (1, 2)), (5, 32, 1, (1, 2)),  # a block multiple: 16 of 32 found
            (10, 40, 1, (7, 8, 9)), (15, 40, 1, (7, 8, 9))]  # partial tail: 32 of 40
    e = drain(engine_for(trace_of(rows)))
    assert e.req.cached_tokens.tolist() == [0, 16, 0, 32]


def test_partial_trace_blocks_and_larger_trace_blocks() -> None:
    # 64-token trace blocks on 16-token engine blocks: prompt 100 = one full trace block
    # (4 engine blocks) + a partial one, which is nobody else's
    rows = [(0, 100, 1, (5, 6)), (5, 120, 1, (5, 6))]
    e = drain(engine_for(trace_of(rows, block=64)))
    assert e.req.cached_tokens.tolist() == [0, 64]


def test_blocks_are_freed_tail_first_and_evicted_lazily_in_lru_order() -> None:
    # A (4 blocks + decode) and B finish; C needs new blocks: the never-used ones go
    # first, then cached ones from the front, A's tail before its prefix
    e = engine_for(trace_of([(0, 64, 1, (1, 2, 3, 4)), (3, 64, 1, (5, 6, 7, 8))]), blocks=10)
    drain(e)
    q = free_queue(e)
    table = e.state.tables[0]
    assert len(q) == 10
    # A and B held 4 full blocks each (one output token: done at their prefill), freed
    # tail first to the back of the queue, behind the 2 blocks never used
    hashed = e.state.blocks[L.B_HASHED]
    cached = [k for k in q if hashed[k]]
    assert q[: 10 - len(cached)] == [k for k in q if not hashed[k]]
    assert len(cached) == 8 and table.min() == -1
    # a request with A's prefix now finds it (nothing reused the blocks: lazy eviction)
    e2 = engine_for(trace_of([(0, 64, 1, (1, 2, 3, 4)), (3, 64, 1, (5, 6, 7, 8)),
                              (6, 64, 1, (1, 2, 3, 4))]), blocks=10)
    assert drain(e2).req.cached_tokens.tolist() == [0, 0, 48]
    # Another request's 4 blocks take the 2 never used, then A's tail (its blocks 3 and 2:
    # freed first, so first in the queue) and so A's prefix keeps 2 blocks: D finds 32
    # tokens; D's 2 new blocks are then B's tail, and E finds B's first 2 blocks
    rows = [(0, 64, 1, (1, 2, 3, 4)), (3, 64, 1, (5, 6, 7, 8)), (6, 64, 1, (10, 11, 12, 13)),
            (9, 64, 1, (1, 2, 3, 4)), (12, 64, 1, (5, 6, 7, 8))]
    e3 = drain(engine_for(trace_of(rows), blocks=10))
    assert e3.req.cached_tokens.tolist() == [0, 0, 0, 32, 32]
    assert e3.prefix_cache_stats["evicted_blocks"] > 0


def test_preempted_request_looks_up_again() -> None:
    # two long decodes in 12 blocks: the later one is preempted, and its own prompt blocks
    # (freed, cached, not reused) are found when it comes back
    rows = [(0, 64, 80, (1, 2, 3, 4)), (0, 64, 80, (5, 6, 7, 8))]
    e = drain(engine_for(trace_of(rows), blocks=12))
    assert e.total_preemptions > 0
    st_ = e.prefix_cache_stats
    assert st_["preempted_queries"] > 0 and st_["preempted_hits"] >= 48
    assert e.req.num_ended == 2 and (e.req.status == Status.FINISHED).all()


def test_cache_salt_keeps_tenants_apart() -> None:
    rows = [(0, 64, 1, (1, 2, 3, 4)), (5, 64, 1, (1, 2, 3, 4)), (10, 64, 1, (1, 2, 3, 4))]
    tr = trace_of(rows, tenant=[0, 1, 0])
    assert drain(engine_for(tr)).req.cached_tokens.tolist() == [0, 48, 48]
    salted = drain(engine_for(tr, cache_salt_by_tenant=True))
    assert salted.req.cached_tokens.tolist() == [0, 0, 48]


def test_off_without_block_ids_and_unchanged_without_sharing() -> None:
    rng = np.random.default_rng(3)
    n = 60
    a, p, o = np.cumsum(rng.exponential(0.5, n)), rng.integers(1, 300, n), rng.integers(1, 60, n)
    plain = Trace.from_arrays(a, p, o)
    cfg = dict(cost_model=UNIT_COST, num_kv_blocks=5000, block_size=BS)
    off = collect(drain_plain(Engine(plain, make_config(**cfg))), None, {}).requests
    on = Engine(plain, make_config(enable_prefix_caching=True, **cfg))
    assert not on.prefix_caching  # no ids: off
    pd.testing.assert_frame_equal(collect(drain_plain(on), None, {}).requests, off)
    # ids nobody shares, memory to spare (no preemption): the same schedule as without
    ids = np.empty(n, dtype=object)
    ids[:] = [tuple(range(1000 * i, 1000 * i + -(-int(x) // BS))) for i, x in enumerate(p)]
    unique = Trace.from_arrays(a, p, o, extra={"hash_ids": ids, "hash_block_tokens": [BS] * n})
    e = drain(Engine(unique, make_config(enable_prefix_caching=True, **cfg)))
    assert e.prefix_caching and e.total_preemptions == 0
    pd.testing.assert_frame_equal(collect(e, None, {}).requests, off)


def drain_plain(engine: Engine) -> Engine:
    while engine.next_decision() is not None:
        engine.decide(Decision())
    return engine


# ------------------------------------------------------------------ properties
def shared_traces(draw: st.DrawFn) -> Trace:
    """Requests whose prompts share prefixes from a few families (chained ids)."""
    n = draw(st.integers(1, 30))
    families = draw(st.integers(1, 4))
    rows = []
    t = 0.0
    for i in range(n):
        t += draw(st.floats(0, 3, allow_nan=False))
        prompt = draw(st.integers(1, 300))
        fam = draw(st.integers(0, families - 1))
        shared = draw(st.integers(0, 8))
        k = -(-prompt // BS)
        ids = tuple(fam * 100 + j if j < shared else 10_000 + i * 100 + j for j in range(k))
        rows.append((t, prompt, draw(st.integers(1, 80)), ids))
    return trace_of(rows)


pool_configs = st.fixed_dictionaries({
    "num_kv_blocks": st.integers(20, 80),
    "max_num_seqs": st.integers(1, 8),
    "max_num_batched_tokens": st.sampled_from([16, 64, 512]),
    "chunked_prefill": st.booleans(),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.composite(shared_traces)(), cfg=pool_configs, seed=st.integers(0, 2**16))
def test_invariants_with_prefix_caching(trace: Trace, cfg: dict, seed: int) -> None:
    """Random traces with shared prefixes, random engines and random decisions: every
    request ends once, the pool is consistent after every step (refs, free queue, map), all
    blocks come back, time never goes backwards, and the same seed gives the same result."""
    def run() -> Engine:
        e = Engine(trace, make_config(enable_prefix_caching=True, block_size=BS, **cfg))
        last = e.now
        rng = np.random.default_rng(seed)
        while (dp := e.next_decision()) is not None:
            assert dp.now >= last
            last = dp.now
            e.decide(random_decision(dp, rng))
            check_pool(e)
        return e

    e = run()
    assert e.done and e.req.num_ended == len(trace)
    assert np.isin(e.req.status, [Status.FINISHED, Status.SHED]).all()
    assert e.kv.free == cfg["num_kv_blocks"] and (e.kv.held == 0).all()
    stats = e.prefix_cache_stats
    assert 0 <= stats["hits"] <= stats["queries"]
    again = run()
    pd.testing.assert_frame_equal(collect(e, None, {}).requests,
                                  collect(again, None, {}).requests)
    assert again.prefix_cache_stats == stats


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.composite(shared_traces)(), cfg=pool_configs)
def test_decode_stretches_are_off_with_named_blocks(trace: Trace, cfg: dict) -> None:
    """With prefix caching the engine iterates one step at a time (no decode stretches: their
    named path cost every run without caching): asking for stretches changes nothing, the
    requests, counters and the named pool (which block holds what, the free queue's order)
    included."""
    def run(stretches: bool) -> Engine:
        e = Engine(trace, make_config(enable_prefix_caching=True, block_size=BS, **cfg),
                   decode_stretches=stretches)
        return drain(e)

    a, b = run(True), run(False)
    assert a.params.ci[L.STRETCH] == 0
    pd.testing.assert_frame_equal(collect(a, None, {}).requests, collect(b, None, {}).requests)
    assert a.prefix_cache_stats == b.prefix_cache_stats
    assert free_queue(a) == free_queue(b)
    np.testing.assert_array_equal(a.state.blocks, b.state.blocks)


def test_a_cache_hit_is_no_swap_in() -> None:
    """Found in review: an admission onto cached blocks was charged as a swap-in (host-link
    time and swap space) wherever the model has a KV size."""
    rows = [(0, 4096, 2, tuple(range(256))), (5, 4096, 2, tuple(range(256)))]
    out = {}
    for kvb in (1, 100_000):
        cfg = make_config(cost_model=UNIT_COST, num_kv_blocks=2000, block_size=BS,
                          max_num_batched_tokens=8192, enable_prefix_caching=True,
                          kv_bytes_per_token=kvb)
        e = drain(Engine(trace_of(rows), cfg))
        assert e.host_free_tokens == Engine(trace_of(rows), cfg).host_free_tokens
        assert e.req.cached_tokens[1] == 4080
        out[kvb] = e.req.first_token_s.tolist()
    assert out[1] == out[100_000]  # no transfer in the hit's first iteration
