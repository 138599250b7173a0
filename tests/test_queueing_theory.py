"""Ground truth from queueing theory: with one request at a time the engine is an M/G/1 queue.

With ``max_num_seqs=1``, no chunking and a linear cost model, a request's service time is
S = (base + c_p x) + (y - 1)(base + c_d): one prefill iteration, then y - 1 decode iterations.
Poisson arrivals then make the engine an M/G/1 FCFS queue, whose mean waiting time is given by
the Pollaczek-Khinchine formula  W_q = lambda E[S^2] / (2 (1 - rho)),  rho = lambda E[S].
"""

from __future__ import annotations

import numpy as np
import pytest

from cbgym import simulate
from cbgym.engine import LinearCostModel
from cbgym.workload.trace import Trace
from tests.conftest import make_config

COST = LinearCostModel(base_s=0.01, prefill_per_token_s=1e-4, decode_per_seq_s=2e-3)
PROMPTS = np.arange(50, 501)  # uniform prompt lengths
OUTPUTS = np.arange(1, 41)  # uniform output lengths


def service_moments() -> tuple[float, float]:
    """E[S] and E[S^2] exactly, from the (independent, uniform) length distributions."""
    a = COST.base_s + COST.prefill_per_token_s * PROMPTS
    b = (OUTPUTS - 1) * (COST.base_s + COST.decode_per_seq_s)
    mean = a.mean() + b.mean()
    second = (a**2).mean() + 2 * a.mean() * b.mean() + (b**2).mean()
    return float(mean), float(second)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_mean_queueing_delay_matches_pollaczek_khinchine(rho: float) -> None:
    mean_s, second_s = service_moments()
    lam = rho / mean_s
    expected = lam * second_s / (2 * (1 - rho))
    rng = np.random.default_rng(12345)
    n = 200_000
    trace = Trace.from_arrays(np.cumsum(rng.exponential(1 / lam, n)),
                              rng.choice(PROMPTS, n), rng.choice(OUTPUTS, n))
    cfg = make_config(cost_model=COST, max_num_seqs=1, chunked_prefill=False,
                      max_num_batched_tokens=4096, num_kv_blocks=10_000)
    res = simulate(trace, engine=cfg)
    measured = float(res.requests.queue_s.iloc[n // 20:].mean())  # drop the empty start
    assert measured == pytest.approx(expected, rel=0.03)
