"""Baseline agents: orderings, privilege, determinism, parsing, and an end-to-end sanity check."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from cbgym import Decision, EngineConfig, LinearCostModel, Trace, simulate
from cbgym.agents import POLICIES, KeyPolicy, QueueView, make_policy
from cbgym.agents.base import OUTPUT_STAT_EDGES, view_from_decision_point
from cbgym.agents.noisy_oracle import believed_outputs
from cbgym.agents.predicted import PredictedOutput
from cbgym.agents.work import WorkCoefficients, estimated_output, work_coefficients
from cbgym.engine import DecisionPoint, Policy, PolicyContext
from cbgym.engine.table_cost import TableCostModel
from tests.conftest import make_config

PAPER = EngineConfig(preset="cbsjf-paper")
NBUCKETS = len(OUTPUT_STAT_EDGES) + 1
# one argument for the policies that need one
ARGS = {"noisy-oracle": "0.7", "noisy-oracle-work": "0.7", "noisy-oracle-aging": "0.7,0.5",
        "noisy-oracle-work-aging": "0.7,0.5"}


def spec(name: str) -> str:
    if name in ARGS:
        return f"{name}:{ARGS[name]}"
    return f"{name}:0.5" if name.endswith("-aging") else name


def linear_cfg(blocks: int = 4096, **kw: object) -> EngineConfig:
    cost = LinearCostModel(base_s=0.01, prefill_per_token_s=1e-4, decode_per_seq_s=1e-3)
    return EngineConfig(preset=None, cost_model=cost, num_kv_blocks=blocks, **kw)


def queue(prompt: list[int], *, waited: list[float] | None = None, now: float = 100.0,
          generated: list[int] | None = None, computed: list[int] | None = None,
          true: list[int] | None = None, by_bucket: np.ndarray | None = None,
          mean: float = float("nan")) -> QueueView:
    n = len(prompt)
    zeros = np.zeros(n, np.int64)
    return QueueView(
        queue_pos=np.arange(n), prompt_tokens=np.array(prompt, np.int64),
        num_computed=zeros if computed is None else np.array(computed, np.int64),
        num_generated=zeros if generated is None else np.array(generated, np.int64),
        num_preemptions=zeros, waited_s=np.zeros(n) if waited is None else np.array(waited),
        tenant=zeros, slo_class=zeros, now=now,
        recent_output_by_bucket=(np.full(NBUCKETS, np.nan, np.float32) if by_bucket is None
                                 else by_bucket),
        recent_output_mean=mean,
        true_output_tokens=None if true is None else np.array(true, np.int64),
    )


def ready(name: str, true: np.ndarray | None = None, cfg: EngineConfig = PAPER,
          seed: int = 0) -> Any:
    """A reset policy with ``keys`` (a KeyPolicy, or oracle-srpt)."""
    pol = make_policy(spec(name))
    assert hasattr(pol, "keys")
    n = 0 if true is None else len(true)
    pol.reset(PolicyContext(cfg, n, seed, true if pol.privileged else None))
    return pol


def order(pol: Any, view: QueueView) -> list[int]:
    return np.argsort(pol.keys(view), kind="stable").tolist()


def synthetic(n: int, seed: int, rate: float = 1.0) -> Trace:
    """Poisson arrivals, lognormal prompt and output lengths."""
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.lognormal(6.8, 0.7, n), 1, 8000).astype(int)
    output = np.clip(rng.lognormal(4.8, 1.0, n), 1, 4000).astype(int)
    return Trace.from_arrays(np.cumsum(rng.exponential(1 / rate, n)), prompt, output,
                             name="synthetic")


# ---------------------------------------------------------------- orderings on hand-made queues
def test_sjf_ctx_ranks_by_prompt_tokens() -> None:
    assert order(ready("sjf-ctx"), queue([900, 10, 300, 10])) == [1, 3, 2, 0]


def test_cb_sjf_work_prices_the_studys_work_formula() -> None:
    by_bucket = np.full(NBUCKETS, np.nan, np.float32)
    by_bucket[0], by_bucket[3] = 2000.0, 20.0  # prompts < 128 answer long, 512..1023 short
    view = queue([100, 600, 2000], by_bucket=by_bucket, mean=50.0)
    keys = ready("cb-sjf-work").keys(view)
    # 2000-token prompt: its bucket saw no completion, so the overall recent mean is used
    expected = 0.008 + 0.00028 * np.array([100, 600, 2000]) + 0.00042 * np.array([2000, 20, 50])
    np.testing.assert_allclose(keys, expected)
    assert np.argsort(keys).tolist() == [1, 2, 0]  # the short prompt's long answers cost more
    # the global estimator ignores buckets: prompt length decides
    assert order(ready("cb-sjf-work:global"), view) == [0, 1, 2]


def test_output_estimate_fallbacks_and_dtype() -> None:
    yhat = estimated_output(queue([100, 5000]))  # nothing completed yet: the prior
    assert yhat.dtype == np.float32 and yhat.tolist() == [128.0, 128.0]
    yhat = estimated_output(queue([100, 5000], generated=[0, 400], mean=64.0))
    assert yhat.tolist() == [64.0, 401.0]  # a preempted request needs more than it produced


def test_ljf_work_is_negated_cb_sjf_work() -> None:
    view = queue([100, 600, 2000], mean=80.0)
    np.testing.assert_array_equal(ready("ljf-work").keys(view), -ready("cb-sjf-work").keys(view))


def test_oracles_rank_by_true_output() -> None:
    true = np.array([5, 400, 50])
    view = queue([3000, 10, 100], true=[5, 400, 50])
    assert order(ready("oracle-sjf", true), view) == [0, 2, 1]
    assert order(ready("oracle-work", true), view) == [2, 1, 0]  # 3000 prompt tokens dominate


def test_oracle_srpt_counts_only_work_left() -> None:
    true = np.array([100, 100, 100])
    # same request three times: fresh, half prefilled, and re-queued after 60 of 100 tokens
    view = queue([1000, 1000, 1000], computed=[0, 500, 0], generated=[0, 0, 60], true=[100] * 3)
    keys = ready("oracle-srpt", true).keys(view)
    np.testing.assert_allclose(keys, [0.28 + 0.042, 0.14 + 0.042, 0.28 + 0.0168 + 0.0168])
    assert np.argsort(keys).tolist() == [1, 2, 0]


def test_aging_adds_credit_for_waiting_without_drift() -> None:
    pol = ready("sjf-ctx-aging:1")
    # 100 extra prompt tokens are 0.028 s of work; waiting 1 s more outweighs them
    assert order(pol, queue([200, 100], waited=[1.0, 0.0])) == [0, 1]
    assert order(ready("sjf-ctx-aging:0"), queue([200, 100], waited=[1.0, 0.0])) == [1, 0]
    # the same requests seen later: identical keys (they depend on arrival, not on now)
    early = pol.keys(queue([200, 100], waited=[1.0, 0.5], now=10.0))
    late = pol.keys(queue([200, 100], waited=[31.0, 30.5], now=40.0))
    np.testing.assert_allclose(early, late, rtol=0, atol=1e-9)
    assert pol.consult == "on_change"
    assert ready("cb-sjf-work-aging:1").consult == "on_completion"


def test_keys_match_a_full_view_of_every_decision_point() -> None:
    """The lazy/cached fast path computes the keys a full QueueView (the env's) gives."""
    tr = synthetic(120, seed=3, rate=3.0)
    for name in POLICIES:
        base = POLICIES[name]
        if not issubclass(base, KeyPolicy) or name == "fcfs" or getattr(base, "sheds", False):
            continue  # a shedding policy decides an order, not keys (cb-sjf-work's keys)
        if issubclass(base, PredictedOutput):
            continue  # predictions made at arrival: no full view has them (test_predictor.py)

        class Spy(base):  # type: ignore[valid-type, misc]
            def static_keys(self) -> None:  # consulted through the door, never in the kernel
                return None

            def decide(self, dp: DecisionPoint) -> Decision:
                d = super().decide(dp)
                if d.priority is not None:
                    full = view_from_decision_point(dp, self.privileged_output_tokens)
                    np.testing.assert_array_equal(self.keys(full), d.priority)
                    self.checked = getattr(self, "checked", 0) + 1
                return d

        arg = spec(name).partition(":")[2]
        pol = Spy(arg) if arg else Spy()
        simulate(tr, pol, PAPER)
        assert pol.checked > 10, name


# ---------------------------------------------------------------- privilege
@pytest.mark.parametrize("name", ["oracle-sjf", "oracle-work", "oracle-srpt", "noisy-oracle",
                                  "oracle-work-aging", "oracle-work-shed"])
def test_oracles_refuse_without_the_privileged_channel(name: str) -> None:
    pol = make_policy(spec(name))
    with pytest.raises(ValueError, match="true output"):
        pol.reset(PolicyContext(PAPER, 3, 0, None))


def test_oracle_keys_refuse_a_content_blind_view() -> None:
    pol = ready("oracle-work", np.array([1, 2]))
    with pytest.raises(ValueError, match="true_output_tokens"):
        pol.keys(queue([10, 20]))


def test_only_privileged_policies_receive_true_outputs() -> None:
    tr = synthetic(30, seed=1, rate=5.0)
    for name in POLICIES:
        if issubclass(POLICIES[name], PredictedOutput):
            continue  # they need a trained predictor: test_predictor.py checks them
        pol = make_policy(spec(name))
        simulate(tr, pol, PAPER)
        assert (pol.ctx.true_output_tokens is not None) == pol.privileged, name
        if not pol.privileged and isinstance(pol, KeyPolicy):
            assert pol.privileged_output_tokens is None, name
    assert not issubclass(POLICIES["oracle-srpt"], KeyPolicy)  # evictions need the fast path
    assert {n for n in POLICIES if POLICIES[n].privileged} == {
        "oracle-sjf", "oracle-work", "oracle-srpt", "noisy-oracle", "noisy-oracle-work",
        "oracle-sjf-aging", "oracle-work-aging", "noisy-oracle-aging", "noisy-oracle-work-aging",
        "oracle-work-uncached", "oracle-work-shed"}


# ---------------------------------------------------------------- determinism and noise
def finish_times(policy: str | Policy, tr: Trace, cfg: EngineConfig = PAPER,
                 seed: int = 0) -> np.ndarray:
    return simulate(tr, policy, cfg, seed=seed).requests["finish_s"].to_numpy()


def test_random_is_seeded_and_fixed_per_request() -> None:
    tr = synthetic(200, seed=2, rate=3.0)
    a, b = finish_times("random", tr, seed=5), finish_times("random", tr, seed=5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, finish_times("random", tr, seed=6))
    pol = make_policy("random")
    pol.reset(PolicyContext(PAPER, 10, 0))
    ids = np.array([7, 2, 5])
    dp = _decision_point(waiting=ids, running=np.array([], np.int64), n=10)
    np.testing.assert_array_equal(pol.decide(dp).priority, pol.decide(dp).priority)


def test_noisy_oracle_keeps_the_multiset_of_lengths() -> None:
    true = np.arange(1, 1001)
    for acc, seed in [(0.0, 0), (0.3, 1), (0.9, 2)]:
        believed = believed_outputs(true, acc, seed)
        np.testing.assert_array_equal(np.sort(believed), true)
        assert (believed != true).sum() <= round((1 - acc) * 1000)
    assert (believed_outputs(true, 0.0, 0) != true).mean() > 0.99
    np.testing.assert_array_equal(believed_outputs(true, 1.0, 0), true)
    np.testing.assert_array_equal(believed_outputs(true, 0.3, 4), believed_outputs(true, 0.3, 4))


def test_noisy_oracle_at_full_accuracy_is_the_oracle() -> None:
    tr = synthetic(200, seed=4, rate=3.0)
    np.testing.assert_array_equal(finish_times("noisy-oracle:1", tr),
                                  finish_times("oracle-sjf", tr))
    np.testing.assert_array_equal(finish_times("noisy-oracle-work:1.0", tr),
                                  finish_times("oracle-work", tr))
    assert not np.array_equal(finish_times("noisy-oracle:0", tr), finish_times("oracle-sjf", tr))


def test_aging_with_a_huge_weight_is_fcfs() -> None:
    tr = synthetic(200, seed=5, rate=3.0)
    fcfs = finish_times("fcfs", tr)
    assert not np.allclose(finish_times("oracle-sjf", tr), fcfs)
    for name in ("oracle-sjf-aging:1e9", "cb-sjf-work-aging:1e9", "sjf-ctx-aging:1e9"):
        # same schedule; an every-iteration policy's clock may differ in the last bits, since
        # the engine then advances one iteration at a time instead of in one stretch
        np.testing.assert_allclose(finish_times(name, tr), fcfs, rtol=1e-12)
    np.testing.assert_array_equal(finish_times("oracle-sjf-aging:0", tr),
                                  finish_times("oracle-sjf", tr))


# ---------------------------------------------------------------- oracle-srpt's evictions
def _decision_point(waiting: np.ndarray, running: np.ndarray, n: int, *, free: int = 1000,
                    shortfall: int = 0, prompt: np.ndarray | None = None,
                    computed: np.ndarray | None = None, generated: np.ndarray | None = None,
                    cfg: EngineConfig = PAPER) -> DecisionPoint:
    zeros = np.zeros(n, np.int64)
    return DecisionPoint(
        now=1.0, iteration=0, waiting=waiting, running=running, shortfall_blocks=shortfall,
        free_blocks=free, num_blocks=cfg.num_kv_blocks or 1, arrival_s=np.zeros(n),
        prompt_tokens=np.full(n, 10, np.int64) if prompt is None else prompt,
        num_computed=zeros if computed is None else computed,
        num_generated=zeros if generated is None else generated, num_preemptions=zeros,
        tenant=zeros, slo_class=zeros, finished=np.empty(0, np.int64), last_iteration_s=0.01,
        total_preemptions=0, config=cfg, running_need_blocks=np.zeros(len(running), np.int64),
        kv_blocks_held=zeros,
    )


def test_oracle_srpt_evicts_only_to_make_room_for_less_work() -> None:
    cfg = linear_cfg(blocks=64, max_num_seqs=3)
    true = np.array([500, 50, 5, 10])
    pol = ready("oracle-srpt", true, cfg)
    prompt = np.array([16, 16, 16, 16])
    decoding = dict(prompt=prompt, computed=np.array([16, 16, 16, 0]),
                    generated=np.array([1, 1, 1, 0]))
    run, wait = np.array([0, 1, 2]), np.array([3])
    full = pol.decide(_decision_point(wait, run, 4, cfg=cfg, **decoding))
    assert list(full.victims) == [0, 1, 2] and list(full.preempt) == [0]  # the batch is full
    roomy = ready("oracle-srpt", true, linear_cfg(blocks=64, max_num_seqs=4))
    d = roomy.decide(_decision_point(wait, run, 4, cfg=roomy.ctx.config, **decoding))
    assert list(d.preempt) == []
    # memory: request 3 needs 4 blocks of 16 tokens (64 tokens), 2 are free; 0 and 1 hold 1 each
    prompt = np.array([16, 16, 16, 64])
    d = roomy.decide(_decision_point(wait, run, 4, free=2, cfg=roomy.ctx.config,
                                     **{**decoding, "prompt": prompt}))
    assert list(d.preempt) == [0, 1]
    d = roomy.decide(_decision_point(wait, run, 4, free=1, cfg=roomy.ctx.config,
                                     **{**decoding, "prompt": prompt}))
    assert list(d.preempt) == []  # evicting all longer requests would not make room
    d = roomy.decide(_decision_point(wait, run, 4, free=2, shortfall=3, cfg=roomy.ctx.config,
                                     **{**decoding, "prompt": prompt}))
    assert list(d.preempt) == [] and list(d.victims) == [0, 1, 2]


def test_oracle_srpt_lets_a_short_request_overtake() -> None:
    # one slot: a long request is running when a short one arrives
    tr = Trace.from_arrays([0.0, 0.05], [20, 20], [400, 3])
    cfg = linear_cfg(max_num_seqs=1)
    srpt = simulate(tr, "oracle-srpt", cfg).requests
    sjf = simulate(tr, "oracle-sjf", cfg).requests
    assert srpt["finish_s"][1] < srpt["finish_s"][0] and srpt["preemptions"][0] == 1
    assert sjf["finish_s"][1] > sjf["finish_s"][0]


def test_an_evicted_request_is_not_served_in_the_iteration_that_evicts_it() -> None:
    tr = Trace.from_arrays([0.0, 0.05], [20, 20], [400, 3])
    res = simulate(tr, "oracle-srpt", linear_cfg(max_num_seqs=1), record_iterations=True)
    it = res.iterations
    evicted_at = int(res.preemption_log["iteration"].iloc[0])
    assert it[it["iteration"] == evicted_at]["request_id"].tolist() == [1]


# ---------------------------------------------------------------- cost-model pricing
def test_work_coefficients_of_a_linear_model() -> None:
    assert work_coefficients(PAPER) == WorkCoefficients(0.008, 0.00028, 0.00042)
    assert work_coefficients(linear_cfg()) == WorkCoefficients(0.01, 1e-4, 1e-3)


def test_work_coefficients_by_finite_differences() -> None:
    # not a LinearCostModel, so its coefficients are found by finite differences
    table = TableCostModel(intercept_s=0.01, prefill_token_s=2e-4, decode_seq_s=3e-4,
                           kv_token_s=0.0)
    cfg = EngineConfig(preset=None, cost_model=table, num_kv_blocks=100)
    coef = work_coefficients(cfg)
    np.testing.assert_allclose([coef.fixed_s, coef.prefill_token_s, coef.decode_seq_s],
                               [0.01, 2e-4, 3e-4])


# ---------------------------------------------------------------- make_policy
def test_make_policy_builds_every_registered_name() -> None:
    for name in POLICIES:
        pol = make_policy(spec(name))
        assert pol.name == name and (pol.__doc__ or "").strip()
    assert make_policy("noisy-oracle-aging:0.8,2").label == "noisy-oracle-aging:0.8,2"
    assert make_policy("cb-sjf-work:global").estimator == "global"


@pytest.mark.parametrize("bad, message", [
    ("nope", r"unknown policy 'nope'; known: cb-sjf-work, .*fcfs"),
    ("noisy-oracle:1.5", r"accuracy must be in \[0, 1\]"),
    ("noisy-oracle:-0.1", r"accuracy must be in \[0, 1\]"),
    ("noisy-oracle:high", "accuracy must be a number"),
    ("noisy-oracle", "needs an accuracy"),
    ("cb-sjf-work-aging:-1", "aging weight must be >= 0"),
    ("sjf-ctx-aging", "needs an aging weight"),
    ("sjf-ctx-aging:2,1", "'sjf-ctx' takes no argument"),
    ("cb-sjf-work:oracle", "estimator must be one of bucket, global"),
    ("fcfs:3", "'fcfs' takes no argument"),
])
def test_make_policy_errors_name_the_problem(bad: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        make_policy(bad)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- end to end
def test_oracle_beats_cb_sjf_work_beats_fcfs_at_high_load() -> None:
    tr = synthetic(1000, seed=0)
    norm = {p: simulate(tr, p, PAPER, load=1.05).summary(warmup=0.1)["norm_latency_mean"]
            for p in ("oracle-work", "cb-sjf-work", "fcfs")}
    assert norm["oracle-work"] < norm["cb-sjf-work"] < norm["fcfs"], norm


@pytest.mark.parametrize("name", ["sjf-ctx", "oracle-sjf", "oracle-work", "noisy-oracle:0.7",
                                  "noisy-oracle-work:0.7", "sjf-ctx-aging:0.5",
                                  "oracle-work-aging:0.5", "random"])
@pytest.mark.parametrize("engine", ["paper", "vllm"])
def test_static_keys_in_the_kernel_equal_consulting_the_policy(name: str, engine: str) -> None:
    """A static-key policy ranked inside the compiled loop (no Python call per decision)
    gives exactly the run of the same policy consulted through the door."""
    tr = synthetic(300, seed=5, rate=6.0)
    cfg = PAPER if engine == "paper" else make_config(num_kv_blocks=400, max_num_seqs=16)
    kernel = make_policy(name)
    door = make_policy(name)
    door.static_keys = lambda: None  # type: ignore[method-assign]
    a, b = simulate(tr, kernel, cfg, seed=3), simulate(tr, door, cfg, seed=3)
    assert kernel.static_keys() is not None
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
