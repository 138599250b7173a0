"""SLO-EDF: earliest TTFT deadline first, shedding the requests that can no longer meet it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import cbgym
from cbgym import SLO, simulate
from cbgym.agents import make_policy
from cbgym.agents.work import shed_lead
from cbgym.engine import PolicyContext

PAPER = cbgym.EngineConfig(preset="cbsjf-paper")


def overload(n: int = 400, seed: int = 0, classes: bool = False) -> cbgym.Trace:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.05, n))
    prompt = rng.integers(50, 2000, n)
    output = rng.integers(5, 300, n)
    slo_class = rng.integers(0, 2, n) if classes else np.zeros(n, np.int64)
    return cbgym.Trace.from_arrays(arrival, prompt, output, slo_class=slo_class)


def test_sheds_late_requests_and_beats_fcfs_on_goodput_under_overload() -> None:
    tr = overload()
    slo = SLO(ttft_s=1.0, tpot_s=0.2)
    edf = simulate(tr, "slo-edf", PAPER, load=1.6, slo=slo)
    fcfs = simulate(tr, "fcfs", PAPER, load=1.6, slo=slo)
    req = edf.requests
    shed = req[req["status"] == "shed"]
    assert len(shed) > 0 and (shed["reason"] == "slo_unreachable").all()
    # every shed request could no longer meet its TTFT target when it was dropped: waited +
    # its own prefill at the engine's linearised cost exceeded it (some before the deadline)
    fixed, per_token = shed_lead("unreachable", PAPER)
    waited = shed["finish_s"] - shed["arrival_s"]
    assert (waited + fixed + per_token * shed["prompt_tokens"] > slo.ttft_s).all()
    assert (waited < slo.ttft_s).any()
    assert edf.summary()["slo_attainment"] > fcfs.summary()["slo_attainment"]


def test_cb_sjf_work_shed_orders_as_cb_sjf_work_and_sheds_the_unreachable() -> None:
    tr = overload()
    slo = SLO(ttft_s=1.0, tpot_s=0.2)
    res = {p: simulate(tr, p, PAPER, load=1.6, slo=slo) for p in
           ("cb-sjf-work-shed", "cb-sjf-work", "slo-edf")}
    req = res["cb-sjf-work-shed"].requests
    shed = req[req["status"] == "shed"]
    assert len(shed) > 0 and (shed["reason"] == "slo_unreachable").all()
    good = {p: r.summary()["slo_attainment"] for p, r in res.items()}
    assert good["cb-sjf-work-shed"] > max(good["cb-sjf-work"], good["slo-edf"])
    # with nothing to shed (targets nobody misses) it is CB-SJF-Work, request for request
    loose = SLO(ttft_s=1e6, tpot_s=1e6)
    a = simulate(tr, "cb-sjf-work-shed", PAPER, load=0.9, slo=loose).requests
    b = simulate(tr, "cb-sjf-work", PAPER, load=0.9, slo=loose).requests
    assert a["first_scheduled_s"].equals(b["first_scheduled_s"])


def test_cb_sjf_work_fit_admits_only_what_its_batch_lets_meet_the_target() -> None:
    tr = overload(600, seed=3)
    slo = SLO(ttft_s=0.5, tpot_s=0.2)
    res = {p: simulate(tr, p, PAPER, load=1.4, slo=slo) for p in
           ("cb-sjf-work-fit", "cb-sjf-work-shed")}
    fit = res["cb-sjf-work-fit"]
    req = fit.requests
    shed = req[req["status"] == "shed"]
    assert len(shed) > 0 and (shed["reason"] == "slo_unreachable").all()
    # on the study's engine an admission step prefills its whole batch: every request of a
    # batch it formed was expected to meet the target, so fewer served requests miss it
    served = {p: r.requests[r.requests["status"] == "finished"] for p, r in res.items()}
    late = {p: int((s["ttft_s"] > slo.ttft_s).sum()) for p, s in served.items()}
    # (the shared prefill is exact on the study's engine: none of fit's batches is late)
    assert late["cb-sjf-work-fit"] == 0 < late["cb-sjf-work-shed"], late
    good = {p: r.summary()["slo_attainment"] for p, r in res.items()}
    assert good["cb-sjf-work-fit"] > good["cb-sjf-work-shed"], good
    # admissions share an iteration: the members of each admitted batch
    first = req.loc[req["status"] == "finished", "first_scheduled_s"]
    assert first.duplicated().any()
    # with targets nobody can miss it is cb-sjf-work-shed (and CB-SJF-Work), request for
    # request; the cap holds as cb-sjf-work-shed's
    loose = SLO(ttft_s=1e6, tpot_s=1e6)
    for spec in ("", ":8"):
        a = simulate(tr, f"cb-sjf-work-fit{spec}", PAPER, load=0.9, slo=loose).requests
        b = simulate(tr, f"cb-sjf-work-shed{spec}", PAPER, load=0.9, slo=loose).requests
        assert a["first_scheduled_s"].equals(b["first_scheduled_s"]), spec
    assert make_policy("cb-sjf-work-fit:8").label == "cb-sjf-work-fit:8"


def assert_same_decisions(rule: str, tr: cbgym.Trace, engine: cbgym.EngineConfig,
                          load: float, slo: SLO) -> None:
    """``rule-tiers`` makes ``rule``'s decisions with one TTFT target, capped or not."""
    for spec in ("", ":8"):
        a = simulate(tr, f"{rule}-tiers{spec}", engine, load=load, slo=slo).requests
        b = simulate(tr, f"{rule}{spec}", engine, load=load, slo=slo).requests
        assert a["first_scheduled_s"].equals(b["first_scheduled_s"]), spec
        assert a["status"].equals(b["status"]), spec


def two_tier_runs(rule: str, engine: cbgym.EngineConfig, tpot_s: tuple[float, float]
                  ) -> dict[str, pd.DataFrame]:
    """The request tables of ``rule-tiers`` and ``rule`` on two tiers (TTFT 1 s and 30 s)."""
    tiers = {0: SLO(ttft_s=1.0, tpot_s=tpot_s[0]), 1: SLO(ttft_s=30.0, tpot_s=tpot_s[1])}
    tr = overload(classes=True)
    return {p: simulate(tr, p, engine, load=1.2, slo=tiers).requests
            for p in (f"{rule}-tiers", rule)}


def test_cb_sjf_work_fit_tiers_admits_the_tighter_target_first_and_is_fit_with_one() -> None:
    # one target for every request: cb-sjf-work-fit's decisions, request for request
    assert_same_decisions("cb-sjf-work-fit", overload(600, seed=3), PAPER, 1.4,
                          SLO(ttft_s=0.5, tpot_s=0.2))
    # two tiers: the tight one is admitted ahead of the loose one's shorter requests, so
    # fewer of it are shed and more meet the target; the loose one still makes its 30 s
    res = two_tier_runs("cb-sjf-work-fit", PAPER, tpot_s=(0.2, 0.2))
    tight = {p: r[r["slo_class"] == 0] for p, r in res.items()}
    shed = {p: int((t["status"] == "shed").sum()) for p, t in tight.items()}  # 33 and 45
    met = {p: int((t["ttft_s"] <= 1.0).sum()) for p, t in tight.items()}  # 154 and 142
    assert shed["cb-sjf-work-fit-tiers"] < shed["cb-sjf-work-fit"], shed
    assert met["cb-sjf-work-fit-tiers"] > met["cb-sjf-work-fit"], met
    loose = res["cb-sjf-work-fit-tiers"].query("slo_class == 1")
    assert (loose["ttft_s"] <= 30.0).mean() > 0.95
    assert make_policy("cb-sjf-work-fit-tiers:24").label == "cb-sjf-work-fit-tiers:24"


def test_oracle_work_shed_orders_by_true_work_and_sheds_as_the_content_blind_rule() -> None:
    tr = overload()
    slo = SLO(ttft_s=1.0, tpot_s=0.2)
    req = simulate(tr, "oracle-work-shed:12", PAPER, load=1.6, slo=slo).requests
    shed = req[req["status"] == "shed"]
    assert len(shed) > 0 and (shed["reason"] == "slo_unreachable").all()
    fixed, per_token = shed_lead("unreachable", PAPER)
    waited = shed["finish_s"] - shed["arrival_s"]
    assert (waited + fixed + per_token * shed["prompt_tokens"] > slo.ttft_s).all()
    pol = make_policy("oracle-work-shed:12")
    assert pol.privileged and pol.label == "oracle-work-shed:12"
    # with nothing to shed and no cap it is oracle-work, request for request
    loose = SLO(ttft_s=1e6, tpot_s=1e6)
    a = simulate(tr, "oracle-work-shed", PAPER, load=0.9, slo=loose).requests
    b = simulate(tr, "oracle-work", PAPER, load=0.9, slo=loose).requests
    assert a["first_scheduled_s"].equals(b["first_scheduled_s"])


def test_tighter_slo_classes_are_admitted_first() -> None:
    tr = overload(classes=True)
    slo = {0: SLO(ttft_s=0.5, tpot_s=0.2), 1: SLO(ttft_s=30.0, tpot_s=0.2)}
    req = simulate(tr, "slo-edf", PAPER, load=1.2, slo=slo).requests
    served = req[req["status"] == "finished"]
    wait = (served["first_scheduled_s"] - served["arrival_s"]).groupby(served["slo_class"])
    assert wait.mean()[0] < wait.mean()[1]


def test_targets_are_checked() -> None:
    pol = make_policy("slo-edf")
    with pytest.raises(ValueError, match="positive"):
        pol.reset(PolicyContext(PAPER, 3, 0, ttft_target_s=np.array([1.0, 0.0, 1.0])))
    pol.reset(PolicyContext(PAPER, 3, 0))  # no targets: the default 2 s
    assert (pol.ttft == 2.0).all()


def test_cb_sjf_work_serial_admits_one_prefill_at_a_time() -> None:
    """On a chunked-prefill engine it admits a request only once every admitted prompt is
    computed: no admission while another prefill is under way, one at a time; it sheds as
    cb-sjf-work-shed sheds, and its cap is its label's."""
    engine = cbgym.EngineConfig(preset="llama-2-7b/a100-80gb", max_num_batched_tokens=512)
    tr = overload(300, seed=5)
    slo = SLO(ttft_s=3.0, tpot_s=0.1)
    for policy in ("cb-sjf-work-serial", "cb-sjf-work-serial:4"):
        req = simulate(tr, policy, engine, load=1.2, slo=slo).requests
        assert req["preemptions"].sum() == 0  # (else a recomputed prompt would overlap)
        served = req[req["status"] == "finished"].sort_values("first_scheduled_s")
        first_token = (served["arrival_s"] + served["ttft_s"]).to_numpy()
        start = served["first_scheduled_s"].to_numpy()
        assert (start[1:] >= first_token[:-1] - 1e-9).all(), policy
        shed = req[req["status"] == "shed"]
        assert len(shed) > 0 and (shed["reason"] == "slo_unreachable").all()
    # the rule it restricts admits while prefills are under way (so the check above bites)
    req = simulate(tr, "cb-sjf-work-shed", engine, load=1.2, slo=slo).requests
    served = req[req["status"] == "finished"].sort_values("first_scheduled_s")
    overlap = served["first_scheduled_s"].to_numpy()[1:] < (
        served["arrival_s"] + served["ttft_s"]).to_numpy()[:-1]
    assert overlap.sum() > 10
    assert make_policy("cb-sjf-work-serial:16").label == "cb-sjf-work-serial:16"


def test_cb_sjf_work_serial_tiers_is_serial_with_one_target_and_admits_the_tight_one_first(
        ) -> None:
    engine = cbgym.EngineConfig(preset="llama-2-7b/a100-80gb", max_num_batched_tokens=512)
    assert_same_decisions("cb-sjf-work-serial", overload(300, seed=5), engine, 1.2,
                          SLO(ttft_s=3.0, tpot_s=0.1))
    res = two_tier_runs("cb-sjf-work-serial", engine, tpot_s=(0.1, 1.0))
    shed = {p: int(((r["slo_class"] == 0) & (r["status"] == "shed")).sum())
            for p, r in res.items()}
    assert shed["cb-sjf-work-serial-tiers"] < shed["cb-sjf-work-serial"], shed
    assert make_policy("cb-sjf-work-serial-tiers:24").label == "cb-sjf-work-serial-tiers:24"


def test_cb_sjf_work_serial_keeps_one_prompt_in_flight_through_preemptions() -> None:
    """With KV memory short enough to preempt, a victim recomputes its prompt and what it
    generated: it counts as prefilling until then, so at every decision at most one running
    request is computing its prompt, the most recently admitted."""
    from cbgym.agents.slo_edf import CBSJFWorkSerial

    seen: list[int] = []

    class Spy(CBSJFWorkSerial):
        def decide(self, dp: cbgym.engine.DecisionPoint) -> cbgym.engine.Decision:
            r = dp.running
            owed = dp.prompt_tokens[r] + np.maximum(dp.num_generated[r] - 1, 0)
            busy = np.flatnonzero(dp.num_computed[r] < owed)
            seen.append(len(busy))
            assert len(busy) == 0 or busy[-1] == len(r) - 1
            return super().decide(dp)

    engine = cbgym.EngineConfig(preset="llama-2-7b/a100-80gb", max_num_batched_tokens=512,
                                num_kv_blocks=300)
    req = simulate(overload(300, seed=5), Spy(), engine, load=1.2,
                   slo=SLO(ttft_s=3.0, tpot_s=0.1)).requests
    assert req["preemptions"].sum() > 0
    assert max(seen) == 1
