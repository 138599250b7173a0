"""Kairos routers (``kairos``, ``kairos-transfer``) on hand-built routing points: each
expectation from TTFT_P and TTFT_D computed here from the formulas, independently."""

from __future__ import annotations

import numpy as np
import pytest

from cbgym import Trace
from cbgym.agents.routing import make_router
from cbgym.agents.routing.kairos import CHUNKS, Kairos
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.routing import LOAD_FIELDS, ROLE_CODES, Loads, Route, RoutingPoint
from cbgym.engine.cost_model import BatchStats

CFG = ClusterConfig.preset("2p2d:llama-2-7b/a100-80gb")  # instances 0, 1: P; 2, 3: D
ENGINE = CFG.engines[0]
ROLE = np.array([ROLE_CODES[r] for r in CFG.roles], np.int64)


def point(prompt: int, ttft: float = 2.0, tpot: float = 0.1, **loads: list) -> RoutingPoint:
    """A routing point with every load 0 (free blocks: all) but those given per instance."""
    cols = {f: np.zeros(4, np.float64 if f in ("kv_usage", "last_iteration_s") else np.int64)
            for f in LOAD_FIELDS}
    cols["free_blocks"][:] = ENGINE.num_kv_blocks
    for name, values in loads.items():
        cols[name] = np.asarray(values, cols[name].dtype)
    return RoutingPoint(request_id=0, now=0.0, prompt_tokens=prompt, waited_s=0.0,
                        ttft_target_s=ttft, tpot_target_s=tpot, role=ROLE,
                        loads=Loads(report_s=0.0, **cols), config=CFG)


def seconds(**stats: int) -> float:
    return float(ENGINE.cost_model.iteration_time(BatchStats(**stats)))


def ttft_p(backlog: int, prompt: int) -> float:
    """The reference's chunks: backlog + prompt as one sequence, budget-sized chunks."""
    total, budget, done, t = backlog + prompt, ENGINE.max_num_batched_tokens, 0, 0.0
    while done < total:
        q = min(budget, total - done)
        t += seconds(num_seqs=1, prefill_tokens=q, decode_seqs=0,
                     sampled_seqs=int(done + q == total), attn_q_ctx=q * done,
                     attn_q_sq=q * (q + 1) // 2, kv_tokens=done + q)
        done += q
    return t


def mixed(b: int, ctx: int, q: int, done: int, last: int) -> float:
    return seconds(num_seqs=b + 1, prefill_tokens=q, decode_seqs=b, sampled_seqs=b + last,
                   attn_q_ctx=ctx + q * done, attn_q_sq=b + q * (q + 1) // 2,
                   kv_tokens=ctx + b + done + q)


def ttft_d(prompt: int, b: int, ctx: int, tbt: float) -> tuple[float, int]:
    """LargestSafe by brute force: every step tries every candidate, largest first."""
    limit, done, t, cap = ENGINE.max_num_batched_tokens - b, 0, 0.0, 0
    while done < prompt:
        left = prompt - done
        for q in sorted({min(c, limit, left) for c in CHUNKS}, reverse=True):
            step = mixed(b, ctx, q, done, int(q == left))
            if step <= tbt:
                break
        else:
            return np.inf, 0
        t, done, cap = t + step, done + q, max(cap, q)
    return t, cap


def test_idle_cluster_short_prompt_deflects() -> None:
    rp = point(256)
    want, cap = ttft_d(256, 0, 0, 0.1)
    p, d, caps = Kairos().estimates(rp)
    assert want < 0.05 and cap == 256
    np.testing.assert_allclose(p, ttft_p(0, 256), rtol=1e-12)
    np.testing.assert_allclose(d, want, rtol=1e-12)
    assert list(caps) == [256, 256]
    assert make_router("kairos").route(rp) == Route.deflect(2, 256)


def test_decode_with_a_deflected_prefill_in_flight_is_skipped() -> None:
    router = make_router("kairos")
    assert router.route(point(256, local_prefills=[0, 0, 1, 0])) == Route.deflect(3, 256)
    both = point(256, local_prefills=[0, 0, 1, 1], num_running=[0, 0, 5, 2])
    assert router.route(both) == Route.disaggregate(0, 3)  # least held decode instance
    # ours: a decode instance without blocks for the prompt would queue it: skipped too
    assert router.route(point(256, free_blocks=[9, 9, 0, 9999])) == Route.deflect(3, 256)


def test_heavy_decode_batch_leaves_no_safe_chunk() -> None:
    b, ctx = 200, 200 * 2000
    alone = seconds(num_seqs=b, prefill_tokens=0, decode_seqs=b, sampled_seqs=b,
                    attn_q_ctx=ctx, attn_q_sq=b, kv_tokens=ctx + b)
    tbt = alone * 1.0001  # the decodes alone fit; with any chunk they do not
    assert mixed(b, ctx, min(CHUNKS), 0, 0) > tbt
    rp = point(1000, tpot=tbt, decode_batch=[0, 0, b, b], decode_context_tokens=[0, 0, ctx, ctx],
               waiting_prefill_tokens=[3000, 1000, 0, 0], num_running=[0, 0, b + 1, b])
    assert list(Kairos().estimates(rp)[1]) == [np.inf, np.inf]
    assert make_router("kairos").route(rp) == Route.disaggregate(1, 3)


def test_alpha_flips_the_decision_at_the_ratio() -> None:
    b, ctx, prompt = 64, 64 * 1000, 4096
    rp = point(prompt, decode_batch=[0, 0, b, b], decode_context_tokens=[0, 0, ctx, ctx],
               waiting_prefill_tokens=[500, 0, 0, 0])
    p, (d, cap) = ttft_p(0, prompt), ttft_d(prompt, b, ctx, 0.1)
    ratio = d / p
    assert 1.0 < ratio < 1.3 and cap == 1024
    assert make_router("kairos").route(rp) == Route.deflect(2, cap)  # default alpha 1.3
    assert make_router(f"kairos:{ratio * 1.001!r}").route(rp) == Route.deflect(2, cap)
    assert make_router(f"kairos:{ratio * 0.999!r}").route(rp) == Route.disaggregate(1, 2)


def test_transfer_term_deflects_where_kairos_does_not() -> None:
    prompt = 4096
    rp = point(prompt)
    link = CFG.link
    transfer = link.setup_s + prompt * ENGINE.kv_bytes_per_token / link.nic_bytes_per_s
    p, (d, cap) = ttft_p(0, prompt), ttft_d(prompt, 0, 0, 0.1)
    np.testing.assert_allclose(make_router("kairos-transfer").prefill_ttft(rp), p + transfer)
    alpha = d / (p + transfer / 2)  # between d / (p + transfer) and d / p
    assert make_router(f"kairos:{alpha!r}").route(rp) == Route.disaggregate(0, 2)
    assert make_router(f"kairos-transfer:{alpha!r}").route(rp) == Route.deflect(2, cap)


def test_ttft_slo_below_ttft_d_disaggregates() -> None:
    d, cap = ttft_d(4096, 0, 0, 0.1)
    assert make_router("kairos").route(point(4096, ttft=d * 0.99)) == Route.disaggregate(0, 2)
    assert make_router("kairos").route(point(4096, ttft=d * 1.01)) == Route.deflect(2, cap)


def test_beta_loosens_the_tbt_budget() -> None:
    rp = point(4096)  # a 2048-token chunk alone takes more than the 0.1 s TBT SLO
    assert make_router("kairos").route(rp).chunk_cap == 1024
    assert make_router("kairos:1.3:2").route(rp).chunk_cap == 2048


@pytest.mark.parametrize(("spec", "param"), [
    ("kairos:fast", "alpha"), ("kairos:-1", "alpha"), ("kairos-transfer:nan", "alpha"),
    ("kairos:1.3:x", "beta"), ("kairos-transfer:1:-0.5", "beta"),
    ("kairos:1:1:1", "at most 2 argument"),
])
def test_bad_spec_arguments(spec: str, param: str) -> None:
    with pytest.raises(ValueError, match=param):
        make_router(spec)


def test_unified_cluster_is_refused() -> None:
    rp = point(10)
    with pytest.raises(ValueError, match="prefill and decode pools"):
        Kairos().prefill_ttft(RoutingPoint(0, 0.0, 10, 0.0, 2.0, 0.1, np.zeros(4, np.int64),
                                           rp.loads, ClusterConfig.preset(
                                               "4x:llama-2-7b/a100-80gb")))


def test_end_to_end_serves_every_request_and_deflects_some() -> None:
    from cbgym.cluster.run import serve

    rng = np.random.default_rng(7)
    n = 60
    trace = Trace.from_arrays(np.cumsum(rng.exponential(0.25, n)), rng.integers(32, 3000, n),
                              rng.integers(8, 120, n), name="kairos-small")
    res = serve(trace, CFG, "kairos")
    req = res.requests
    assert (req["status"] == "finished").all()
    assert req["deflected"].any() and not req["deflected"].all()
    assert res.meta["router"] == "kairos:1.3:1"
