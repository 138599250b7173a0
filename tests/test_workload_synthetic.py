"""Synthetic workloads: renewal arrivals and lengths fitted to the Azure 2023 traces (offline)."""

from __future__ import annotations

import numpy as np
import pytest

from cbgym.workload import (
    from_distributions,
    gamma_arrivals,
    poisson_arrivals,
    synthetic_trace,
)
from cbgym.workload.synthetic import LENGTH_FITS, TRACE_RATE, LengthMixture

# Statistics of the real Azure 2023 traces (see cbgym/workload/synthetic.py for the fit).
REAL = {
    "conv": {"prompt": (1155, 1020, 4142, 14050), "output": (211, 129, 601, 1000)},
    "code": {"prompt": (2048, 1469, 7436, 7437), "output": (28, 13, 251, 1899)},
}


def gap_cv(arrival: np.ndarray) -> float:
    gaps = np.diff(arrival)
    return float(gaps.std() / gaps.mean())


def test_same_seed_same_trace() -> None:
    a, b = synthetic_trace("code", 500, seed=3), synthetic_trace("code", 500, seed=3)
    for column in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, column), getattr(b, column))
    c = synthetic_trace("code", 500, seed=4)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


def test_load_changes_keep_lengths() -> None:
    base = synthetic_trace("conv", 300, seed=1)
    bursty = synthetic_trace("conv", 300, rate=20.0, cv=3.0, seed=1)
    np.testing.assert_array_equal(base.prompt_tokens, bursty.prompt_tokens)
    np.testing.assert_array_equal(base.output_tokens, bursty.output_tokens)
    assert not np.array_equal(base.arrival_s, bursty.arrival_s)


def test_defaults_match_real_trace_size_and_rate() -> None:
    trace = synthetic_trace("conv")
    assert len(trace) == 19_366 and trace.arrival_s[0] == 0.0
    assert trace.rate == pytest.approx(TRACE_RATE["conv"], rel=0.03)
    assert trace.name == "synthetic-conv(n=19366,rate=5.5301,cv=1,seed=0)"
    assert len(synthetic_trace("code")) == 8_819


def test_poisson_arrivals() -> None:
    arrival = poisson_arrivals(200_000, rate=4.0, rng=0)
    assert arrival[0] == 0.0 and np.all(np.diff(arrival) >= 0)
    assert gap_cv(arrival) == pytest.approx(1.0, abs=0.02)
    assert 1 / np.diff(arrival).mean() == pytest.approx(4.0, rel=0.01)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_arrivals_cv_and_rate(cv: float) -> None:
    arrival = gamma_arrivals(200_000, rate=3.0, cv=cv, rng=1)
    assert gap_cv(arrival) == pytest.approx(cv, rel=0.05)
    assert 1 / np.diff(arrival).mean() == pytest.approx(3.0, rel=0.03)


def test_gamma_special_cases() -> None:
    np.testing.assert_array_equal(gamma_arrivals(50, 2.0, 1.0, rng=5), poisson_arrivals(50, 2.0, 5))
    np.testing.assert_allclose(gamma_arrivals(4, 2.0, 0.0), [0.0, 0.5, 1.0, 1.5])
    rng = np.random.default_rng(9)
    assert len(gamma_arrivals(1, 1.0, 2.0, rng=rng)) == 1


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: poisson_arrivals(0, 1.0), "num_requests"),
        (lambda: poisson_arrivals(5, 0.0), "rate"),
        (lambda: gamma_arrivals(5, 1.0, cv=-1.0), "cv"),
        (lambda: synthetic_trace("chat"), "kind"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


@pytest.mark.parametrize("kind", ["conv", "code"])
def test_fitted_marginals_match_real_trace(kind: str) -> None:
    trace = synthetic_trace(kind, num_requests=100_000, seed=7)  # type: ignore[arg-type]
    for column, values in (("prompt", trace.prompt_tokens), ("output", trace.output_tokens)):
        mean, p50, p99, maximum = REAL[kind][column]
        assert values.mean() == pytest.approx(mean, rel=0.10), (kind, column, "mean")
        assert np.median(values) == pytest.approx(p50, rel=0.10), (kind, column, "p50")
        assert np.percentile(values, 99) == pytest.approx(p99, rel=0.20), (kind, column, "p99")
        assert 1 <= values.min() and values.max() <= maximum


def test_length_mixture_sampling_follows_components() -> None:
    mixture = LengthMixture.from_rows(
        [(0.25, np.log(100), np.log(10), 1e-9, 0.0, 1e-9),
         (0.75, np.log(1000), np.log(50), 1e-9, 0.0, 1e-9)],
        max_prompt=10_000, max_output=10_000,
    )
    prompt, output = mixture.sample(np.random.default_rng(0), 20_000)
    assert set(np.unique(prompt)) == {100, 1000}
    assert np.mean(prompt == 1000) == pytest.approx(0.75, abs=0.02)
    assert np.all((prompt == 100) == (output == 10))


def test_length_mixture_clips_and_validates() -> None:
    mixture = LengthMixture.from_rows([(1.0, 20.0, -20.0, 0.01, 0.0, 0.01)], 500, 64)
    prompt, output = mixture.sample(np.random.default_rng(0), 10)
    assert prompt.tolist() == [500] * 10 and output.tolist() == [1] * 10
    with pytest.raises(ValueError, match="not a distribution"):
        LengthMixture.from_rows([(0.5, 1.0, 1.0, 1.0, 0.0, 1.0)], 10, 10)
    assert set(LENGTH_FITS) == {"conv", "code"}


def test_from_distributions() -> None:
    arrival = poisson_arrivals(1000, 2.0, rng=1)
    trace = from_distributions(arrival, 512, lambda rng, n: rng.geometric(1 / 128, n), seed=2)
    assert len(trace) == 1000 and set(trace.prompt_tokens.tolist()) == {512}
    assert trace.output_tokens.mean() == pytest.approx(128, rel=0.1)
    again = from_distributions(arrival, 512, lambda rng, n: rng.geometric(1 / 128, n), seed=2)
    np.testing.assert_array_equal(trace.output_tokens, again.output_tokens)
    fixed = from_distributions([0.0, 1.0, 2.0], [1, 2, 3], 7, name="tiny")
    assert fixed.prompt_tokens.tolist() == [1, 2, 3] and fixed.name == "tiny"
    with pytest.raises(ValueError, match="integer >= 1"):
        from_distributions([0.0, 1.0], 0, 1)


def test_at_request_rate_is_vllms_benchmark_arrivals() -> None:
    """Issue 15: ``--request-rate R --burstiness B`` as vLLM's benchmark draws them: Gamma
    gaps of shape B and mean 1/R (B = 1: Poisson), the requests' token counts kept."""
    import cbgym
    from cbgym.workload import at_request_rate, synthetic_trace

    tr = synthetic_trace("code", 20_000, seed=1)
    for b in (1.0, 0.25, 4.0):
        out = at_request_rate(tr, 5.0, b, seed=3)
        gaps = np.diff(out.arrival_s)
        assert out.arrival_s[0] == 0.0 and (gaps >= 0).all()
        assert abs(gaps.mean() * 5.0 - 1.0) < 0.05
        assert abs(gaps.std() / gaps.mean() - b ** -0.5) < 0.06
        np.testing.assert_array_equal(out.prompt_tokens, tr.prompt_tokens)
        np.testing.assert_array_equal(out.output_tokens, tr.output_tokens)
    np.testing.assert_array_equal(at_request_rate(tr, 5.0, 0.5, 7).arrival_s,
                                  at_request_rate(tr, 5.0, 0.5, 7).arrival_s)
    for bad in ({"rate": 0.0}, {"rate": float("inf")}, {"burstiness": 0.0},
                {"burstiness": True}):
        with pytest.raises(ValueError):
            at_request_rate(tr, **{"rate": 5.0, "burstiness": 1.0, **bad})
    small = tr.window(0, 200)
    a = cbgym.simulate(small, request_rate=3.0, burstiness=0.5, seed=2).requests
    b_ = cbgym.simulate(at_request_rate(small, 3.0, 0.5, 2)).requests
    np.testing.assert_array_equal(a["ttft_s"].to_numpy(), b_["ttft_s"].to_numpy())
    with pytest.raises(ValueError, match="not both"):
        cbgym.simulate(small, load=0.8, request_rate=3.0)
    with pytest.raises(ValueError, match="request_rate"):
        cbgym.simulate(small, burstiness=0.5)
