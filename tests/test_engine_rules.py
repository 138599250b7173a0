"""Each scheduling rule of the engine, pinned on a small hand-made workload.

The engines here use one second per iteration (UNIT_COST), so iteration k of a busy engine runs
over [k, k+1) and arrivals at integer times land exactly before an iteration.
"""

from __future__ import annotations

import numpy as np
import pytest

from cbgym import SLO, simulate
from cbgym.engine import Decision, Engine, EngineConfig, InvalidDecisionError, LinearCostModel
from tests.conftest import UNIT_COST, make_config, make_trace, schedule_log


def unit_engine(rows, record=True, consult="on_change", **cfg):
    cfg.setdefault("cost_model", UNIT_COST)
    return Engine(make_trace(rows), make_config(**cfg), consult=consult, record_iterations=record)


def test_decode_is_one_token_and_first_token_comes_with_last_prompt_chunk() -> None:
    eng = unit_engine([(0, 10, 3)])
    assert schedule_log(eng) == [{0: 10}, {0: 1}, {0: 1}]
    assert eng.req.first_token_s[0] == 1.0 and eng.req.finish_s[0] == 3.0


def test_chunked_prefill_splits_prompt_by_budget() -> None:
    eng = unit_engine([(0, 40, 2)], max_num_batched_tokens=16)
    assert schedule_log(eng) == [{0: 16}, {0: 16}, {0: 8}, {0: 1}]
    assert eng.req.first_token_s[0] == 3.0  # the token is sampled with the last chunk


def test_running_requests_are_served_before_waiting_ones() -> None:
    # request 0 decodes; request 1 arrives and gets what the budget leaves after the decode
    eng = unit_engine([(0, 8, 5), (1, 40, 2)], max_num_batched_tokens=16)
    steps = schedule_log(eng)
    assert steps[1] == {0: 1, 1: 15}
    assert list(steps[1]) == [0, 1]  # running first, then the admitted one


def test_max_num_seqs_caps_running_requests() -> None:
    eng = unit_engine([(0, 4, 3)] * 3, max_num_seqs=2)
    steps = schedule_log(eng)
    assert set(steps[0]) == {0, 1}
    assert 2 not in steps[1] and 2 not in steps[2]
    assert steps[3] == {2: 4}


def test_chunked_prefill_off_waits_for_the_whole_prompt_to_fit_the_budget() -> None:
    eng = unit_engine([(0, 4, 4), (0, 15, 2)], max_num_batched_tokens=16,
                      chunked_prefill=False)
    steps = schedule_log(eng)
    assert steps[0] == {0: 4}  # 4 + 15 > 16: the second prompt may not be split
    assert steps[1] == {0: 1, 1: 15}


def test_prompt_longer_than_budget_without_chunking_is_shed() -> None:
    res = simulate(make_trace([(0, 40, 2)]), engine=make_config(max_num_batched_tokens=16,
                                                                chunked_prefill=False))
    row = res.requests.iloc[0]
    assert row.status == "shed" and row.reason == "prompt_exceeds_token_budget"


def test_admission_stops_at_first_request_that_does_not_fit() -> None:
    # 4 blocks of 4 tokens; request 1 needs 3 blocks, request 2 would fit in the 1 left
    eng = unit_engine([(0, 4, 3), (0, 12, 1), (0, 2, 1)], num_kv_blocks=4, block_size=4)
    steps = schedule_log(eng)
    assert set(steps[0]) == {0, 1, 2} or set(steps[0]) == {0, 1}
    eng = unit_engine([(0, 8, 3), (0, 12, 1), (0, 2, 1)], num_kv_blocks=4, block_size=4)
    steps = schedule_log(eng)
    assert steps[0] == {0: 8}  # head-of-line: 2 is not admitted past the blocked 1


def test_blocks_are_allocated_as_tokens_are_computed() -> None:
    eng = unit_engine([(0, 5, 10)], block_size=4)
    eng.decide(Decision()) if eng.next_decision() else None
    assert eng.kv.held[0] == 2  # 5 prompt tokens -> 2 blocks of 4
    while eng.next_decision() is not None:
        eng.decide(Decision())
    assert eng.kv.free == eng.kv.num_blocks


def test_preemption_recompute_evicts_latest_admitted_and_requeues_at_head() -> None:
    # 5 blocks of 2 tokens. Two requests of 2-token prompts, 6-token outputs (4 blocks each at
    # most): when blocks run out the most recently admitted (1) is preempted, later recomputed
    eng = unit_engine([(0, 2, 6), (0, 2, 6)], num_kv_blocks=5, block_size=2)
    steps = schedule_log(eng)
    log, pre = eng.recorder.batch_log()
    assert pre.size and set(pre[:, 1]) == {1}
    first_pre = int(pre[0, 0])
    assert steps[first_pre] == {0: 1}  # no admission in the iteration that preempted
    resumed = next(s for s in steps[first_pre + 1:] if 1 in s)
    assert resumed[1] > 1  # recompute: prompt + generated tokens again
    assert eng.req.preemptions[1] >= 1 and eng.req.generated[1] == 6


def test_policy_chooses_the_victim() -> None:
    eng = unit_engine([(0, 2, 6), (0, 2, 6)], num_kv_blocks=5, block_size=2)
    while (dp := eng.next_decision()) is not None:
        eng.decide(Decision(victims=[0] if 0 in dp.running else None))
    _, pre = eng.recorder.batch_log()
    assert pre[0, 1] == 0


def test_swap_keeps_kv_and_charges_the_host_link() -> None:
    cost = LinearCostModel(base_s=1.0, prefill_per_token_s=0, decode_per_seq_s=0,
                           host_link_bytes_per_s=1e6)
    kw = dict(num_kv_blocks=5, block_size=2, cost_model=cost, kv_bytes_per_token=1000)
    rec = unit_engine([(0, 2, 6), (0, 2, 6)], preemption="recompute", **kw)
    swp = unit_engine([(0, 2, 6), (0, 2, 6)], preemption="swap", **kw)
    rec_steps, swp_steps = schedule_log(rec), schedule_log(swp)
    resumed = [next(s[1] for s in steps[int(e.recorder.batch_log()[1][0, 0]) + 1:] if 1 in s)
               for steps, e in ((rec_steps, rec), (swp_steps, swp))]
    assert resumed[0] > 1 and resumed[1] == 1  # swap resumes decoding, recompute re-prefills
    durations = swp.recorder.timeseries()[:, 1]
    assert durations.max() > 1.0  # swap traffic costs host-link time


def test_request_that_can_never_fit_is_shed_with_a_reason() -> None:
    res = simulate(make_trace([(0, 100, 2), (0, 4, 2)]),
                   engine=make_config(num_kv_blocks=4, block_size=4))
    assert list(res.requests.status) == ["shed", "finished"]
    assert res.requests.reason.iloc[0] == "prompt_exceeds_kv_capacity"
    # fits at admission, outgrows the whole cache while decoding: shed, not an endless loop
    res = simulate(make_trace([(0, 10, 50)]), engine=make_config(num_kv_blocks=4, block_size=4))
    assert res.requests.status.iloc[0] == "shed"
    assert res.requests.reason.iloc[0] == "kv_capacity_exceeded"


def test_hold_and_shed_through_the_decision() -> None:
    eng = unit_engine([(0, 4, 2), (0, 4, 2), (0, 4, 2)])
    dp = eng.next_decision()
    assert dp is not None and list(dp.waiting) == [0, 1, 2]
    eng.decide(Decision(order=[2], shed=[1], shed_reason="too late"))
    assert eng.req.status[2] == 2 and eng.req.status[0] == 1  # 2 runs, 0 held
    assert eng.req.reason[1] == "too late"


def test_priority_orders_admission() -> None:
    eng = unit_engine([(0, 4, 2), (0, 4, 2), (0, 4, 2)], max_num_seqs=1)
    dp = eng.next_decision()
    eng.decide(Decision(priority=np.array([3.0, 1.0, 2.0])))
    assert eng.running == [1]
    assert dp is not None


@pytest.mark.parametrize("bad", [
    Decision(order=[7]), Decision(order=[0, 0]), Decision(victims=[0]),
    Decision(priority=np.array([1.0])), Decision(shed=[-1]),
])
def test_invalid_decisions_are_rejected(bad: Decision) -> None:
    eng = unit_engine([(0, 4, 2), (0, 4, 2)])
    eng.next_decision()
    with pytest.raises(InvalidDecisionError):
        eng.decide(bad)


def test_decide_without_decision_point_is_an_error() -> None:
    eng = unit_engine([(0, 4, 2)])
    with pytest.raises(RuntimeError, match="next_decision"):
        eng.decide(Decision())


def test_paper_mode_separates_prefill_and_decode_and_reserves_output() -> None:
    cfg = EngineConfig(preset="cbsjf-paper")
    res = simulate(make_trace([(0, 100, 3), (0.001, 50, 2)]), engine=cfg,
                   record_iterations=True)
    ts = res.timeseries
    # step 1: prefill of request 0 alone: 8 ms + 0.28 ms x 100
    assert ts.duration_s.iloc[0] == pytest.approx(0.008 + 0.028)
    assert ts.prefill_tokens.iloc[0] == 100 and ts.decode_seqs.iloc[0] == 0
    # step 2: request 1 arrived during step 1: a prefill step again, before any decode
    assert ts.prefill_tokens.iloc[1] == 50 and ts.decode_seqs.iloc[1] == 0
    # step 3: decode for both: 12 ms + 0.42 ms x 2
    assert ts.duration_s.iloc[2] == pytest.approx(0.012 + 0.00084)
    assert ts.kv_blocks_used.iloc[0] == 103  # prompt + true output reserved (block size 1)


def test_paper_mode_sheds_what_can_never_be_reserved() -> None:
    res = simulate(make_trace([(0, 60_000, 10_000)]), engine=EngineConfig(preset="cbsjf-paper"))
    assert res.requests.reason.iloc[0] == "kv_reservation_exceeds_capacity"


def test_max_model_len_caps_generation() -> None:
    res = simulate(make_trace([(0, 10, 50)]), engine=make_config(max_model_len=20))
    row = res.requests.iloc[0]
    assert row.status == "finished" and row.reason == "max_model_len"


def test_ttft_tpot_and_goodput() -> None:
    res = simulate(make_trace([(0, 10, 3), (0, 10, 1)]),
                   engine=make_config(cost_model=UNIT_COST), slo=SLO(ttft_s=1.5, tpot_s=2))
    r = res.requests
    assert list(r.ttft_s) == [1.0, 1.0]
    assert r.tpot_s.iloc[0] == pytest.approx(1.0)  # (3 - 1) / (3 - 1)
    s = res.summary()
    assert s["slo_attainment"] == 1.0 and s["goodput_rps"] == pytest.approx(2 / 3)


def test_chrome_trace_export(tmp_path) -> None:
    res = simulate(make_trace([(0, 10, 3), (0, 2, 2)]), engine=make_config(),
                   record_iterations=True)
    doc = res.to_chrome_trace(tmp_path / "t.json")
    assert (tmp_path / "t.json").exists()
    assert any(e["name"] == "req 1" for e in doc["traceEvents"])
    assert len(res.iterations) == 5
