"""The study's scale (cbgym.week): a 2024 week, synthetic or from its file, run in segments
that end at idle points, with the results of one run over the whole week."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cbgym.engine import itl
from cbgym.engine import layout as L
from cbgym.simulate import simulate
from cbgym.week import WEEK_2024, length_mixture, run_week, week_source
from cbgym.workload.trace import Trace


def whole(source, load: float, policy: str, mu: float) -> tuple[np.ndarray, int, int]:
    """The reference: one run over all of ``source`` (norm-latency bins, finished, good)."""
    parts = list(source.chunks())
    arrival, prompt, output = (np.concatenate([c[i] for c in parts]) for i in range(3))
    stretch = source.requests / (load * mu) / source.span_s
    res = simulate(Trace.from_arrays(arrival * stretch, prompt, output, name="w", rebase=False),
                   policy, "cbsjf-paper")
    req = res.requests
    fin = req[req["status"] == "finished"]
    h = np.zeros(itl.SLOTS)
    itl.add_values(h, (fin["e2e_s"] / fin["output_tokens"]).to_numpy())
    good = int(((fin["ttft_s"] <= 2.0) & (fin["tpot_s"] <= 0.1)).sum())
    return h, len(fin), good


@pytest.mark.parametrize(("kind", "policy"), [("code", "fcfs"), ("conv", "oracle-work")])
def test_segments_give_the_one_runs_results(kind: str, policy: str) -> None:
    """Segments of 1,500 requests (grown where a busy period is longer: the code week is
    bursty) give the one run's results: every request's normalised latency in the same
    bin, the same finished and good counts."""
    src = week_source(kind, requests=12_000, seed=3, real=False)
    got = run_week(src, policy=policy, load=0.95, segment=1_500)
    assert got.segments > 3 and got.rerun_requests > 0
    bins, finished, good = whole(src, 0.95, policy, got.capacity_rps)
    np.testing.assert_array_equal(got.norm_latency[: itl.NUM_BINS], bins[: itl.NUM_BINS])
    assert got.norm_latency[itl.SUM] == pytest.approx(bins[itl.SUM], rel=1e-12)
    assert (got.num_finished, got.num_good) == (finished, good)
    assert got.num_requests == 12_000 == got.num_finished + got.num_shed


def test_the_synthetic_week_has_the_2024_scale() -> None:
    """Its lengths have the published 2024 means; its arrivals the week's rate; the chunks
    are the same on every pass and the span is their last arrival."""
    for kind, fit in WEEK_2024.items():
        p, o = length_mixture(kind).sample(np.random.default_rng(5), 200_000)
        assert p.mean() == pytest.approx(fit.mean_prompt, rel=0.01)
        assert o.mean() == pytest.approx(fit.mean_output, rel=0.01)
    src = week_source("conv", requests=2_500_000, real=False)
    chunks = list(src.chunks())
    assert [len(c[0]) for c in chunks] == [1_000_000, 1_000_000, 500_000]
    assert chunks[-1][0][-1] == pytest.approx(src.span_s, rel=1e-12)
    rate = WEEK_2024["conv"].requests / (7 * 86_400)
    assert src.span_s == pytest.approx(2_500_000 / rate, rel=0.01)
    again = next(iter(src.chunks()))
    assert all(np.array_equal(a, b) for a, b in zip(again, chunks[0], strict=True))
    assert week_source("conv").requests == 27_303_999
    assert week_source("code").requests == 16_803_695  # (44.1M together)


def test_a_real_week_file_is_read_in_chunks(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for k in range(50):
        rows.append(f"2024-05-10 00:{k // 60:02d}:{k % 60:02d}.00993+00:00,{100 + k},"
                    f"{0 if k == 7 else 5 + k % 9}")
    (tmp_path / "AzureLLMInferenceTrace_conv_1week.csv").write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("CBGYM_TRACE_DIR", str(tmp_path))
    src = week_source("conv")
    assert src.requests == 49 and src.span_s == pytest.approx(49.0)  # (the 0-output row: out)
    arrival, prompt, output = next(iter(src.chunks()))
    assert arrival[0] == 0 and prompt[:2].tolist() == [100, 101] and (output > 0).all()
    res = run_week(src, load=0.5)
    assert res.num_requests == 49
    assert week_source("conv", real=False).name.startswith("synthetic-conv-week")


def test_bad_arguments_are_clear_errors() -> None:
    src = week_source("code", requests=100, real=False)
    with pytest.raises(ValueError, match="asked in Python"):
        run_week(src, policy="cb-sjf-work")
    with pytest.raises(ValueError, match="load"):
        run_week(src, load=0)
    with pytest.raises(ValueError, match="kind"):
        week_source("chat")
    with pytest.raises(ValueError, match="at least 2"):
        week_source("conv", requests=1)


def test_the_summary_has_the_studys_accountings() -> None:
    """The marginal work share of the synthetic 2024 weeks: the study's 91.2% (conv) and
    98.7% (code), within half a point (their lengths have its means)."""
    for kind, want in (("conv", 91.2), ("code", 98.7)):
        res = run_week(week_source(kind, requests=30_000, real=False), load=0.8)
        row = res.summary()
        assert row["marginal_work_share_pct"] == pytest.approx(want, abs=0.5)
        assert 0 < row["engine_time_share_pct"] <= 100
        assert row["num_requests"] == 30_000 and row["peak_rss_mib"] > 0
    assert L.FINISHED  # (the codes the reduction reads)
