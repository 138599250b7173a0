"""The noisy neighbour: an interactive tenant beside a long-prompt batch tenant on one engine
(``cbgym bench --noisy-neighbour``).

A conversation trace is the interactive tenant (tier ``interactive``: 450 ms / 40 ms) and a
code trace the batch tenant (tier ``batch``: 30 s / 1 s; its prompts are about twice as
long), mixed at ``share`` of the requests for the interactive one
(:func:`cbgym.workload.tenants.mix_tenants`) and offered at ``load`` of the engine's capacity
on the mix. Each tenant's SLO attainment and p99 TTFT, Jain's index of their attainments
and the largest service difference between them, under FCFS, tenant-aware priority (vLLM's
priority policy with the tier as priority), strict tiers, VTC, DRR and WFQ (equal weights),
a running cap (``cb-sjf-work-shed:24``: CB-SJF-Work, shedding requests that can no longer
meet their TTFT, at most 24 running), and the interactive tenant alone on the engine
(isolation: what it gets with no neighbour).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pandas as pd

from cbgym.capacity import measure_capacity, scale_to_load
from cbgym.engine.config import EngineConfig
from cbgym.fairness import jain_index, max_service_difference, service_over_time, tenant_table
from cbgym.simulate import simulate
from cbgym.workload.tenants import Tenant, mix_tenants, tier_slos
from cbgym.workload.trace import Trace

# (cb-sjf-work-shed:24: a running batch of at most 24, the tenants-noisy-neighbour task's
# reference tuned on its validation windows)
POLICIES = ("fcfs", "priority", "strict-tiers", "vtc", "drr", "wfq", "cb-sjf-work-shed:24")
SERVICE_WINDOW_S = 10.0


def noisy_neighbour_mix(interactive: Trace, batch: Trace, requests: int, share: float,
                        load: float, engine: EngineConfig) -> tuple[Trace, float]:
    """The two tenants' mix at ``load`` of ``engine``'s capacity on it, and that capacity:
    the first ``share`` x ``requests`` of ``interactive`` and the rest from ``batch``."""
    if not 0 < share < 1:
        raise ValueError(f"share={share!r}: expected in (0, 1)")
    if requests < 2:
        raise ValueError(f"requests={requests!r}: expected at least 2")
    n_chat = max(1, min(int(requests * share), requests - 1))
    if n_chat > len(interactive) or requests - n_chat > len(batch):
        raise ValueError(f"requests={requests}: the traces hold {len(interactive)} and "
                         f"{len(batch)} requests, fewer than the mix needs")
    chat = Tenant("interactive", share, tier="interactive")
    bulk = Tenant("batch", 1 - share, tier="batch")
    mixed = mix_tenants([(chat, interactive.window(0, n_chat)),
                         (bulk, batch.window(0, requests - n_chat))], rate_rps=1.0)
    mu = measure_capacity(mixed, engine)
    return scale_to_load(mixed, load, engine, capacity_rps=mu), mu


def noisy_neighbour_table(mixed: Trace, engine: EngineConfig,
                          policies: Sequence[str] = POLICIES) -> pd.DataFrame:
    """One row per policy (and ``isolation``): per-tenant attainment (the interactive
    tenant's TTFT and TPOT targets also apart) and p99 TTFT, Jain's
    index, the largest service difference (VTC's cost-weighted tokens, over
    ``SERVICE_WINDOW_S`` windows) and the run's wall time."""
    slo = tier_slos()
    rows = []
    for policy in policies:
        t = time.perf_counter()
        res = simulate(mixed, policy=policy, engine=engine, slo=slo)
        wall = time.perf_counter() - t
        tab = tenant_table(res)
        att = tab["slo_attainment"]
        diff = max_service_difference(service_over_time(res, SERVICE_WINDOW_S))
        rows.append({"policy": policy, **_parts(res.requests, slo),
                     "interactive_attainment": att[0],
                     "interactive_ttft_p99_s": tab["ttft_p99_s"][0],
                     "batch_attainment": att[1], "batch_ttft_p99_s": tab["ttft_p99_s"][1],
                     "jain": jain_index(att.to_numpy()), "max_service_difference": diff,
                     "wall_s": wall})
    keep = mixed.tenant == 0  # the interactive tenant alone, at the same times
    only = Trace.from_arrays(mixed.arrival_s[keep], mixed.prompt_tokens[keep],
                             mixed.output_tokens[keep], tenant=mixed.tenant[keep],
                             slo_class=mixed.slo_class[keep], rebase=False, name="isolated")
    res = simulate(only, policy="fcfs", engine=engine, slo=slo)
    tab = tenant_table(res)
    rows.append({"policy": "isolation", **_parts(res.requests, slo),
                 "interactive_attainment": tab["slo_attainment"][0],
                 "interactive_ttft_p99_s": tab["ttft_p99_s"][0]})
    return pd.DataFrame(rows)


def _parts(req: pd.DataFrame, slo: dict) -> dict[str, float]:
    """The interactive tenant's requests meeting each target apart (TTFT, TPOT)."""
    mine = req[req["tenant"].to_numpy() == 0]
    target = slo[int(mine["slo_class"].iloc[0])] if len(mine) else None
    if target is None:
        return {}
    return {"interactive_ttft_ok": float((mine["ttft_s"] <= target.ttft_s).mean()),
            "interactive_tpot_ok": float((mine["tpot_s"] <= target.tpot_s).mean())}


def format_table(table: pd.DataFrame) -> str:
    """The table as markdown (blank where a figure does not apply)."""
    def cell(v: object, fmt: str) -> str:
        return "" if pd.isna(v) else format(v, fmt)  # type: ignore[arg-type]

    lines = ["| policy | interactive attainment | TTFT met | TPOT met | interactive p99 TTFT "
             "(s) | batch attainment | batch p99 TTFT (s) | Jain | max service difference |",
             "|---" * 9 + "|"]
    for r in table.itertuples(index=False):
        lines.append(f"| {r.policy} | {cell(r.interactive_attainment, '.3f')} | "
                     f"{cell(r.interactive_ttft_ok, '.3f')} | "
                     f"{cell(r.interactive_tpot_ok, '.3f')} | "
                     f"{cell(r.interactive_ttft_p99_s, '.2f')} | "
                     f"{cell(r.batch_attainment, '.3f')} | {cell(r.batch_ttft_p99_s, '.2f')} | "
                     f"{cell(r.jain, '.3f')} | {cell(r.max_service_difference, ',.0f')} |")
    return "\n".join(lines)


__all__ = ["POLICIES", "format_table", "noisy_neighbour_mix", "noisy_neighbour_table"]
