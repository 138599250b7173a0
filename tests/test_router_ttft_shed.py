"""``ttft-shed:F[:BASE[:K]]``: the SLO-aware door. A 429 once the estimated TTFT on the
instance the base router picks passes F x the target (x exp(-K x its KV usage)); otherwise the
base's route, unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from cbgym import SLO, ClientModel, Trace
from cbgym.agents.routing import make_router
from cbgym.cluster.config import ClusterConfig
from cbgym.cluster.route_ops import prefill_seconds
from cbgym.cluster.routing import Route
from cbgym.cluster.run import serve
from cbgym.cluster.state import BUDGET, COST_KIND
from cbgym.cluster.tables import static_tables
from cbgym.workload.synthetic import synthetic_trace


def test_an_arrival_behind_a_long_prefill_is_shed_when_it_cannot_make_its_target() -> None:
    """One replica, reports every 100 ms: the first 2,000-token prompt is alone (its estimate
    is its own prefill); the second arrives 1 ms later, behind it as the router counts what
    it sent since the report (twice the work), and is refused with a factor between the two;
    the third, after the first has finished, is admitted."""
    cfg = ClusterConfig.preset("1x:llama-3.1-8b/a100-80gb", load_report_interval_s=0.1)
    inst, coefs = static_tables(cfg)
    alone = prefill_seconds(inst[COST_KIND, 0], coefs[0], inst[BUDGET, 0], np.int64(2000))
    assert 0 < alone < 1.0
    factor = 1.5 * alone / 2.0  # of the 2 s target: more than one prompt, less than two
    tr = Trace.from_arrays(np.array([0.0, 0.001, 30.0]), np.full(3, 2000), np.full(3, 20),
                           name="three")
    res = serve(tr, cfg, make_router(f"ttft-shed:{factor}"), slo=SLO(2.0, 0.1),
                client=ClientModel(max_retries=0))
    assert res.clients["outcome"].tolist() == ["good", "shed", "good"]
    assert res.requests["reason"].iloc[1] == "ttft_unreachable"


@pytest.mark.parametrize("base", ["jsq-time", "least-outstanding", "kairos"])
def test_with_room_to_spare_it_is_its_base_router(base: str) -> None:
    cluster = "2p2d:llama-2-7b/a100-80gb" if base == "kairos" else "2x:llama-2-7b/a100-80gb"
    cfg = ClusterConfig.preset(cluster)
    tr = synthetic_trace("conv", 200, rate=20.0, seed=3)
    a = serve(tr, cfg, make_router(f"ttft-shed:1000:{base}"), slo=SLO(2.0, 0.1)).requests
    b = serve(tr, cfg, make_router(base), slo=SLO(2.0, 0.1)).requests
    assert a.equals(b)
    # a factor no prefill can meet: every arrival is refused
    c = serve(tr, cfg, make_router(f"ttft-shed:1e-9:{base}"), slo=SLO(2.0, 0.1),
              client=ClientModel(max_retries=0)).requests
    assert (c["reason"] == "ttft_unreachable").all()  # (even an empty queue: its own prefill)


@pytest.mark.parametrize("spec, message", [
    ("ttft-shed", "needs a factor: 'ttft-shed:F"),
    ("ttft-shed:0", "F a number > 0"),
    ("ttft-shed:inf", "F a number > 0"),
    ("ttft-shed:x", "got 'x'"),
    ("ttft-shed:1:ttft-shed", "its base cannot be another door"),
    ("ttft-shed:1:jsq-time:-1", "K .* must be a number >= 0, got '-1'"),
    ("ttft-shed:1:jsq-time:nan", "K .* must be a number >= 0"),
    ("ttft-shed:1:jsq-time:x", "got 'x'"),
])
def test_bad_specs_say_what_is_expected(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_router(spec)


def test_a_deflection_counts_what_was_sent_to_its_decode_instance_since_the_report() -> None:
    """On a 2P2D cluster with empty queues, Kairos deflects a 2,000-token prompt to a decode
    instance. The door keeps it while few requests were sent there since the report, and
    sheds it once many were (each counts as one more prompt ahead: they join the batch the
    deflected prefill shares; the module's deliberate overcount)."""
    from cbgym.cluster.routing import LOAD_FIELDS, ROLE_CODES, Loads, RouterContext, RoutingPoint

    cfg = ClusterConfig.preset("2p2d:deepseek-v2-lite/a100-80gb")
    role = np.array([ROLE_CODES[r] for r in cfg.roles])
    n = len(role)
    rows: dict = {f: np.zeros(n, np.int64) for f in LOAD_FIELDS}
    rows.update(kv_usage=np.zeros(n), last_iteration_s=np.zeros(n),
                free_blocks=np.full(n, 100_000))
    loads = Loads(report_s=0.0, **rows)
    kairos, door = make_router("kairos"), make_router("ttft-shed:0.5:kairos")
    for r in (kairos, door):
        r.reset(RouterContext(config=cfg))
    inst, coefs = static_tables(cfg)
    d = int(np.flatnonzero(role == ROLE_CODES["decode"])[0])
    for k in (0, 1, 16):
        sent = np.where(role == ROLE_CODES["decode"], k, 0)
        rp = RoutingPoint(0, 0.0, 2000, 0.0, 2.0, 0.1, role, loads, cfg, None, sent)
        route = kairos.route(rp)
        assert route.prefill is None and role[route.decode] == ROLE_CODES["decode"]
        t = prefill_seconds(inst[COST_KIND, d], coefs[d], inst[BUDGET, d],
                            np.int64((k + 1) * 2000))
        assert door.route(rp) == (Route.shed("ttft_unreachable") if t > 0.5 * 2.0 else route)
        assert (t > 1.0) == (k == 16)


def test_its_label_is_canonical() -> None:
    assert make_router("ttft-shed:1.0").label == make_router("ttft-shed:1").label
    # K = 0 is the plain door, named as it
    assert make_router("ttft-shed:1:jsq-time:0").label == "ttft-shed:1:jsq-time"
    assert make_router("ttft-shed:0.12:jsq-time:2.50").label == "ttft-shed:0.12:jsq-time:2.5"
    assert make_router("ttft-shed:0.5:kairos:1").label == "ttft-shed:0.5:kairos:1"


def _idle_point(kv_usage: list[float]) -> tuple[ClusterConfig, object]:
    """A routing point on idle replicas (one per entry of ``kv_usage``, each KV cache that
    full; nothing else in the report): a 2,000-token prompt."""
    from cbgym.cluster.routing import LOAD_FIELDS, ROLE_CODES, Loads, RoutingPoint

    n = len(kv_usage)
    cfg = ClusterConfig.preset(f"{n}x:llama-3.1-8b/a100-80gb")
    role = np.array([ROLE_CODES[r] for r in cfg.roles])
    rows: dict = {f: np.zeros(n, np.int64) for f in LOAD_FIELDS}
    rows.update(kv_usage=np.array(kv_usage), last_iteration_s=np.zeros(n),
                free_blocks=np.full(n, 100_000))
    rp = RoutingPoint(0, 0.0, 2000, 0.0, 2.0, 0.1, role, Loads(report_s=0.0, **rows), cfg,
                      None, np.zeros(n, np.int64))
    return cfg, rp


def _factor(cfg: ClusterConfig) -> float:
    """F just above a 2,000-token prompt's own prefill on an idle replica (of a 2 s target)."""
    inst, coefs = static_tables(cfg)
    alone = prefill_seconds(inst[COST_KIND, 0], coefs[0], inst[BUDGET, 0], np.int64(2000))
    return 1.05 * alone / 2.0


@pytest.mark.parametrize("kv_usage", [0.0, 0.3, 0.9])
def test_k_tightens_the_bound_as_the_kv_cache_fills(kv_usage: float) -> None:
    """The bound is F x target x exp(-K x KV usage): with F just above the prompt's own
    prefill (its estimate on an idle replica), K = 0 admits it at any KV usage, K = 1 at
    none but an empty cache (exp(-0.3) = 0.74 < 1 / 1.05)."""
    from cbgym.cluster.routing import RouterContext

    cfg, rp = _idle_point([kv_usage])
    factor = _factor(cfg)
    plain, tight = make_router(f"ttft-shed:{factor}"), make_router(f"ttft-shed:{factor}:jsq-time:1")
    for r in (plain, tight):
        r.reset(RouterContext(config=cfg))
    assert plain.route(rp) == Route.to(0)  # type: ignore[arg-type]
    expected = Route.to(0) if kv_usage == 0 else Route.shed("ttft_unreachable")
    assert tight.route(rp) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("kv_usage, admitted", [([0.9, 0.0], False), ([0.0, 0.9], True)])
def test_k_reads_the_kv_usage_of_the_instance_the_base_picks(kv_usage: list[float],
                                                             admitted: bool) -> None:
    """Two idle replicas: jsq-time picks the first (a tie, the lowest index). The door sheds
    when that replica's cache is full and admits when only the other's is (the cluster's mean,
    0.45, would shed both: exp(-0.45) = 0.64 < 1 / 1.05; its maximum too)."""
    from cbgym.cluster.routing import RouterContext

    cfg, rp = _idle_point(kv_usage)
    door = make_router(f"ttft-shed:{_factor(cfg)}:jsq-time:1")
    door.reset(RouterContext(config=cfg))
    assert door.route(rp) == (Route.to(0) if admitted else Route.shed("ttft_unreachable"))  # type: ignore[arg-type]
