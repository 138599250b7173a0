"""A decode stretch that gives blocks to remote arrivals in its middle, bit for bit plain
iteration.

On a cluster every remote arrival at a decode instance also bounds that instance's horizon
(through its prefill instance), so a stretch there meets them at its first step only. Here a
routed standalone engine gets every request delivered ahead of time, some as remote prompts
(``REMOTE_NEW``), and the test lands each transfer a fixed delay after it starts: arrivals
then reach a running stretch's arrival branch (``cbgym.engine.stretch_admit``). Found worth
a test in review.
"""

from __future__ import annotations

import heapq

import numpy as np
import pandas as pd
import pytest

from cbgym import EngineConfig, LinearCostModel, Trace
from cbgym.engine import handoff
from cbgym.engine import layout as L
from cbgym.engine.engine import Engine, EngineStuckError
from cbgym.metrics import SLO, requests_frame


def run(seed: int, stretches: bool) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    r = np.random.default_rng(seed)
    n = int(r.integers(10, 60))
    tr = Trace.from_arrays(np.sort(r.uniform(0, 2, n)), r.integers(1, 800, n),
                           r.integers(1, 300, n), name="remote", rebase=False)
    remote = r.random(n) < float(r.choice([0.5, 0.8, 1.0]))
    remote[0] = False  # (a local request first: something decodes while the others arrive)
    cfg = EngineConfig(preset=None, cost_model=LinearCostModel(0.01, 1e-4, 2e-4),
                       num_kv_blocks=int(r.integers(60, 600)), block_size=16,
                       max_num_batched_tokens=int(r.choice([16, 64, 2048])),
                       max_num_seqs=int(r.choice([2, 4, 256])),
                       max_model_len=int(r.choice([400, 2000])) if r.random() < 0.3 else None)
    keyed = bool(r.random() < 0.5)  # FCFS, or a static key (shortest prompt first)
    eng = Engine(tr, cfg, consult="on_change" if keyed else "never", routed=True,
                 decode_stretches=stretches,
                 keys=tr.prompt_tokens.astype(float) if keyed else None)
    s = eng.state
    for j in range(n):
        handoff.deliver(s, j, float(tr.arrival_s[j]), int(tr.output_tokens[j]), False,
                        L.REMOTE_NEW if remote[j] else L.LOCAL, 0, 1)
    delay = float(r.choice([1e-3, 0.05, 0.3]))
    landings: list[tuple[float, int]] = []
    outbox = []
    for _ in range(100_000):
        code = eng.run_until(landings[0][0] if landings else np.inf, None)
        for k in range(s.si[L.OUTBOX_N]):
            rid = int(s.ids[L.OUTBOX, k])
            t = float(s.times[L.KV_EVENT, rid])
            outbox.append((rid, t, int(s.req[L.STATUS, rid])))
            if s.req[L.STATUS, rid] == L.WAITING:  # its transfer starts: it lands later
                heapq.heappush(landings, (t + delay, rid))
        s.si[L.OUTBOX_N] = 0
        if landings and (s.sf[L.NOW] >= landings[0][0] or code == L.DRAINED):
            t, rid = heapq.heappop(landings)
            if code == L.DRAINED:
                s.sf[L.NOW] = max(s.sf[L.NOW], t)
            handoff.kv_landed(s, rid, 16)
            s.si[L.IDLED] = 0
        elif code == L.DRAINED:
            break
    return requests_frame(eng.req, SLO()), pd.DataFrame(eng.recorder.timeseries()), outbox


@pytest.mark.parametrize("seeds", [range(k, k + 40) for k in range(0, 160, 40)])
def test_remote_arrivals_in_the_middle_of_a_stretch(seeds: range) -> None:
    ran = 0
    for seed in seeds:
        runs = []
        for stretches in (True, False):
            try:
                runs.append(run(seed, stretches))
            except EngineStuckError:
                runs.append(None)
        a, b = runs
        assert (a is None) == (b is None), seed  # stuck in both or in neither
        if a is None or b is None:
            continue
        pd.testing.assert_frame_equal(a[0], b[0], check_exact=True)
        pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)
        assert a[2] == b[2]  # the outbox: the same transfers, at the same times
        ran += 1
    assert ran >= len(seeds) // 2
