"""What a policy sees of the prefix cache, the cache-aware policies, and the engine's hit
rate on Mooncake's conversation trace with an infinite cache."""

from __future__ import annotations

import numpy as np
import pytest

import cbgym
from cbgym.agents import make_policy
from cbgym.agents.base import _NO_STATS, QueueView
from cbgym.engine import Decision, Engine, LinearCostModel
from cbgym.engine.decision import PolicyContext
from cbgym.workload.prefix_reuse import leading_hits
from tests.conftest import UNIT_COST, make_config
from tests.test_prefix_cache import BS, trace_of


def view(prompt: list[int], cached: list[int] | None, waited: list[float]) -> QueueView:
    n = len(prompt)
    z = np.zeros(n, np.int64)
    return QueueView(queue_pos=np.arange(n), prompt_tokens=np.array(prompt), num_computed=z,
                     num_generated=z, num_preemptions=z, waited_s=np.array(waited, float),
                     tenant=z, slo_class=z, now=10.0, recent_output_by_bucket=_NO_STATS,
                     recent_output_mean=float("nan"),
                     cached_tokens=None if cached is None else np.array(cached))


def ready(spec: str, **config: object):
    pol = make_policy(spec)
    cfg = make_config(cost_model=LinearCostModel(), **config)
    pol.reset(PolicyContext(config=cfg, num_requests=4, seed=0))
    return pol


def test_decision_point_shows_the_cached_prefix() -> None:
    # request 0 (4 shared blocks) runs a long decode; 1 and 2 arrive behind a third long
    # prompt that fills the budget: at their decision point 1 finds 48 tokens, 2 none
    rows = [(0, 64, 40, (1, 2, 3, 4)), (1.5, 70, 2, (1, 2, 3, 9, 10)),
            (1.5, 70, 2, (5, 6, 7, 8, 11))]
    e = Engine(trace_of(rows), make_config(cost_model=UNIT_COST, num_kv_blocks=200,
                                           block_size=BS, enable_prefix_caching=True),
               consult="always")
    seen = {}
    while (dp := e.next_decision()) is not None:
        for rid in dp.waiting:
            seen.setdefault(int(rid), int(dp.cached_tokens[rid]))
        if len(dp.waiting) > 1:
            assert dp.shared_prefix_blocks(dp.waiting).tolist() == [0, 0]
            assert np.isfinite(dp.prefix_cache_hit_rate)
        e.decide(Decision())
    assert seen == {0: 0, 1: 48, 2: 0}
    assert e.req.cached_tokens.tolist() == [0, 48, 0]
    plain = Engine(trace_of(rows), make_config(cost_model=UNIT_COST, num_kv_blocks=200,
                                               block_size=BS), consult="always")
    dp = plain.next_decision()
    assert dp.cached_tokens is None and np.isnan(dp.prefix_cache_hit_rate)
    assert dp.shared_prefix_blocks(dp.waiting).tolist() == [0] * len(dp.waiting)


def test_shared_prefix_blocks_between_waiting_requests() -> None:
    rows = [(0, 64, 1, (1, 2, 3, 4)), (0, 64, 1, (1, 2, 7, 8)), (0, 40, 1, (5, 6, 9))]
    e = Engine(trace_of(rows), make_config(cost_model=UNIT_COST, num_kv_blocks=200,
                                           block_size=BS, enable_prefix_caching=True),
               consult="always")
    dp = e.next_decision()
    assert dp.shared_prefix_blocks(np.array([0, 1, 2])).tolist() == [2, 2, 0]


def test_cache_aware_keys() -> None:
    v = view([1000, 300, 600], [900, 0, 0], [1.0, 2.0, 3.0])
    assert ready("shortest-uncached-first").keys(v).tolist() == [100, 300, 600]
    assert np.argmin(ready("cb-sjf-work-uncached").keys(v)) == 0
    # hrrn: minus the response ratio, the service priced on the uncached prefill
    hrrn = ready("hrrn-uncached")
    service = hrrn.coef.fixed_s + hrrn.coef.prefill_token_s * np.array([100, 300, 600])
    np.testing.assert_allclose(hrrn.keys(v), -(1 + np.array([1.0, 2.0, 3.0]) / service))
    # without a cache (None) each is its cache-blind twin
    blind = view([1000, 300, 600], None, [1.0, 2.0, 3.0])
    assert ready("shortest-uncached-first").keys(blind).tolist() == [1000, 300, 600]


def test_k_lpm_takes_the_oldest_then_the_longest_matches() -> None:
    # waited: 0 is the oldest; cached: 3 > 1 > 2 > 4
    v = view([100] * 5, [0, 64, 32, 96, 16], [9.0, 1.0, 2.0, 3.0, 4.0])
    order = np.argsort(ready("k-lpm:2").keys(v), kind="stable").tolist()
    assert order == [0, 3, 4, 1, 2]  # oldest, best match; oldest left (4), best left (1); 2
    assert np.argsort(ready("k-lpm:1").keys(v), kind="stable").tolist() == [0, 4, 3, 2, 1]
    with pytest.raises(ValueError, match="k"):
        make_policy("k-lpm:1.5")


def test_cache_aware_policies_run_end_to_end_and_order_by_uncached_work() -> None:
    # 1 long prompt mostly cached (its prefix resident behind a running decode) and a
    # shorter uncached one arrive together while the budget is busy: uncached-first takes
    # the long one first, SJF-Ctx the short one
    rows = [(0, 512, 30, tuple(range(32))), (0.5, 64, 2, (200, 201, 202, 203)),
            (2.5, 600, 2, tuple(range(32)) + (300, 301, 302, 303, 304, 305)),
            (2.5, 200, 2, tuple(range(400, 413)))]
    tr = trace_of(rows)
    cfg = make_config(cost_model=UNIT_COST, num_kv_blocks=400, block_size=BS,
                      max_num_batched_tokens=64, max_num_seqs=2, enable_prefix_caching=True)
    first = {}
    for spec in ("shortest-uncached-first", "sjf-ctx"):
        res = cbgym.simulate(tr, engine=cfg, policy=spec)
        r = res.requests
        first[spec] = int(r.loc[[2, 3], "first_scheduled_s"].idxmin())
    assert first == {"shortest-uncached-first": 2, "sjf-ctx": 3}


def test_infinite_cache_hits_are_the_traces_leading_prefix_reuse(trace_dir) -> None:
    """Mooncake conversation, 2,000 requests one at a time into a cache that never evicts:
    the engine finds exactly the leading-prefix reuse of the trace's ids, over full 512-token
    blocks and capped so the last token is computed (vLLM's rules)."""
    if trace_dir is None or not (trace_dir / "mooncake").is_dir():
        pytest.skip("Mooncake traces not present (set CBGYM_TRACE_DIR)")
    from cbgym.workload import load_trace

    tr = load_trace("mooncake-conversation").window(0, 2000)
    e, want = infinite_cache(tr)
    assert e.prefix_cache_stats["evicted_blocks"] == 0
    assert e.req.cached_tokens.tolist() == want.tolist()
    assert e.prefix_cache_stats["hits"] == int(want.sum())


def infinite_cache(tr) -> tuple[Engine, np.ndarray]:  # type: ignore[no-untyped-def]
    """``tr`` one request at a time into a cache that never evicts, and what the trace's own
    leading-prefix reuse says each request finds under vLLM's rules (full 512-token blocks,
    at most prompt - 1 tokens)."""
    blocks = int(np.sum(-(-(tr.prompt_tokens + tr.output_tokens) // BS)))
    cfg = cbgym.EngineConfig(preset=None, cost_model=LinearCostModel(), num_kv_blocks=blocks,
                             enable_prefix_caching=True, max_num_seqs=1,
                             max_num_batched_tokens=1 << 20)
    e = Engine(tr, cfg, consult="never")
    while e.next_decision() is not None:
        e.decide(Decision())
    full = tr.prompt_tokens // 512
    want = np.minimum(np.minimum(leading_hits(tr), full) * 512,
                      (tr.prompt_tokens - 1) // BS * BS)
    return e, want


@pytest.mark.slow
def test_whole_mooncake_conversation_infinite_cache(trace_dir) -> None:
    """All 12,031 requests (about 1 GB of named blocks): the engine's hits are the trace's
    leading-prefix reuse under vLLM's rules, 36.60% of the trace's 512-token blocks against
    the 36.64% (36.6%) of ids it reuses: the partial last blocks vLLM cannot cache and the
    last-token cap make the difference."""
    if trace_dir is None or not (trace_dir / "mooncake").is_dir():
        pytest.skip("Mooncake traces not present (set CBGYM_TRACE_DIR)")
    from cbgym.workload import load_trace, prefix_reuse

    tr = load_trace("mooncake-conversation")
    e, want = infinite_cache(tr)
    assert e.prefix_cache_stats["hits"] == int(want.sum())
    reuse = prefix_reuse(tr)
    assert round(100 * reuse["block_hit_fraction"], 1) == 36.6
    assert round(100 * e.prefix_cache_stats["hits"] / 512 / reuse["blocks"], 2) == 36.60
