"""The routing rules, compiled: one implementation for the cluster loop and the routers.

A rule reads a load report (``loads``: rows in :data:`cbgym.cluster.routing.LOAD_FIELDS`
order, a column per instance), the instances' static rows (``inst``: ``ROLE``, ``BUDGET``,
``BLOCK``, ``SEQS``, ``KV_BYTES``, ``COST_KIND`` of :mod:`cbgym.cluster.state`; jsq-time also
its dynamic ``ROUTED`` row, the requests routed to each since the load report) and cost
coefficients, and writes a route into ``out``: prefill instance (-1: none), decode
instance, chunk cap. The cluster loop calls :func:`route_rule` at each arrival when its
router is one of these; the Python routers of :mod:`cbgym.agents.routing` call the same
function on a :class:`~cbgym.cluster.routing.RoutingPoint`, so a rule exists once. What each
rule does is documented with its router class (``basic``, ``disagg``, ``kairos``).
"""

from __future__ import annotations

import numpy as np

from cbgym.cluster.routing import LOAD_FIELDS
from cbgym.cluster.state import (
    ALPHA,
    BETA,
    BLOCK,
    BUDGET,
    COST_KIND,
    DECODE,
    KV_BYTES,
    LENGTH,
    NIC,
    PREFILL,
    QUEUE,
    ROLE,
    ROUTED,
    SEQS,
    SETUP,
    THRESHOLD,
    UNIFIED,
)
from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.layout import _codes
from cbgym.engine.pricing import TABLE, price

# rule codes (DOOR: a Python router answers at the door)
(DOOR, ROUND_ROBIN, LEAST_OUTSTANDING, JSQ_TOKENS, ALWAYS, NEVER, DYNAMO, LLM_D, KAIROS,
 KAIROS_TRANSFER, JSQ_TIME) = _codes(11)
RULES = {"round-robin": ROUND_ROBIN, "least-outstanding": LEAST_OUTSTANDING,
         "jsq-tokens": JSQ_TOKENS, "always-disaggregate": ALWAYS, "never-disaggregate": NEVER,
         "dynamo": DYNAMO, "llm-d": LLM_D, "kairos": KAIROS, "kairos-transfer": KAIROS_TRANSFER,
         "jsq-time": JSQ_TIME}
# load rows
(W_N, W_TOK, R_N, D_BATCH, D_CTX, R_TOK, KV_USE, FREE_B, T_IN, T_OUT, LOCAL_P, LAST_DT,
 INCOMING_N, HELD_OUT) = (np.int64(LOAD_FIELDS.index(f)) for f in LOAD_FIELDS)
# LargestSafe's candidate chunks, largest first (Kairos)
CHUNKS = np.array([2048, 1024, 512, 256, 128], np.int64)


@no_alloc_kernel
def committed(loads: np.ndarray, i: int) -> float:
    """Requests instance i holds or has been promised (waiting + running + incoming)."""
    return loads[W_N, i] + loads[R_N, i] + loads[INCOMING_N, i]


@no_alloc_kernel
def prefill_work(loads: np.ndarray, i: int) -> float:
    """Prompt tokens instance i has still to compute (waiting and running)."""
    return loads[W_TOK, i] + loads[R_TOK, i]


@no_alloc_kernel
def pool_size(inst: np.ndarray, role: int) -> int:
    k = 0
    for i in range(inst.shape[1]):
        k += inst[ROLE, i] == role
    return k


@no_alloc_kernel
def pick(code: int, inst: np.ndarray, loads: np.ndarray, role: int, count: int) -> int:
    """A load-balancing rule's pick in the pool of ``role`` (-1: the pool is empty)."""
    size = pool_size(inst, role)
    if size == 0:
        return -1
    nth = (count - 1) % size
    best, k = -1, 0
    for i in range(inst.shape[1]):
        if inst[ROLE, i] != role:
            continue
        if code == ROUND_ROBIN:
            if k == nth:
                return i
            k += 1
            continue
        if best < 0:
            best = i
            continue
        if code == LEAST_OUTSTANDING or role == DECODE and code != JSQ_TOKENS:
            if committed(loads, i) < committed(loads, best):
                best = i
            continue
        # jsq-tokens: fewest prompt tokens to compute, then fewest held; decode instances
        # by held first
        a, b = prefill_work(loads, i), committed(loads, i)
        x, y = prefill_work(loads, best), committed(loads, best)
        if role == DECODE:
            a, b, x, y = b, a, y, x
        if a < x or (a == x and b < y):
            best = i
    return best


@no_alloc_kernel
def least_prefill(inst: np.ndarray, loads: np.ndarray) -> int:
    best = -1
    for i in range(inst.shape[1]):
        if inst[ROLE, i] == PREFILL and (best < 0 or prefill_work(loads, i)
                                         < prefill_work(loads, best)):
            best = i
    return best


@no_alloc_kernel
def prefill_seconds(kind: int, coef: np.ndarray, budget: int, total: int) -> float:
    """Seconds a prefill instance takes for ``total`` tokens as one sequence cut into chunks
    of its token budget, each priced as a prefill-only iteration over the tokens before it;
    only the last chunk samples (Kairos's TTFT_P)."""
    seconds = 0.0
    for done in range(0, total, budget):
        q = min(budget, total - done)
        seconds += price(kind, coef, 1, q, 0, np.int64(done + q == total), q * done,
                         q * (q + 1) // 2, done + q, 0)
    return seconds


@no_alloc_kernel
def decode_ttft(kind: int, coef: np.ndarray, budget: int, b: int, ctx: int, prompt: int,
                tbt: float, bound: float, cached: int = 0) -> tuple[float, int]:
    """(TTFT_D, chunk cap) by LargestSafe on a decode instance with ``b`` decodes over
    ``ctx`` tokens, the prompt's first ``cached`` tokens in its prefix cache (computed:
    the walk starts after them); (inf, 0) if no safe chunk or once the sum passes ``bound``.
    A candidate that failed uncut stays failed (its step only grows with the context done),
    except for a table model fitted with a negative ``kv_token_s``."""
    limit = budget - b  # vLLM schedules the running decodes first
    if limit <= 0:
        return np.inf, 0
    restart = kind == TABLE and coef[3] < 0
    total, done, cap, i = 0.0, cached, 0, 0
    largest = min(CHUNKS[0], limit)
    while done < prompt:
        left, q, t = prompt - done, 0, np.inf
        if left <= largest:  # every candidate >= left is the last chunk: it samples
            t = price(kind, coef, b + 1, left, b, b + 1, ctx + left * done,
                      b + left * (left + 1) // 2, ctx + b + done + left, 0)
            q = left if t <= tbt else 0
        if q == 0:
            i = 0 if restart else i
            while i < len(CHUNKS):
                c = min(CHUNKS[i], limit)
                if c < left and (i == 0 or c != min(CHUNKS[i - 1], limit)):
                    t = price(kind, coef, b + 1, c, b, b, ctx + c * done, b + c * (c + 1) // 2,
                              ctx + b + done + c, 0)
                    if t <= tbt:
                        q = c
                        break
                i += 1
        if q == 0:
            return np.inf, 0
        total, done, cap = total + t, done + q, max(cap, q)
        if total > bound:
            return np.inf, 0
    return total, cap


@no_alloc_kernel
def kairos_ok(inst: np.ndarray, loads: np.ndarray, d: int, prompt: int, cached: int = 0
              ) -> bool:
    """Kairos may consider decode instance d: no deflected prefill in flight, free blocks
    for the prompt (less its ``cached`` tokens there: optimistic where cached blocks nobody
    holds are counted free too) and a free sequence slot."""
    blocks = -(-(prompt - cached) // inst[BLOCK, d])
    return (loads[LOCAL_P, d] == 0 and loads[FREE_B, d] >= blocks
            and loads[R_N, d] < inst[SEQS, d])


@no_alloc_kernel
def queue_seconds(inst: np.ndarray, coefs: np.ndarray, loads: np.ndarray, i: int,
                  prompt: int, cached: int) -> float:
    """jsq-time's estimate of this prompt's TTFT on instance i (``ttft-shed``'s too): its
    pending prompt tokens and the prompts routed there since the report (``inst[ROUTED]``,
    each counted as this one), then this prompt less the ``cached`` tokens its prefix cache
    holds, priced as one sequence on its own cost model (Kairos's TTFT_P)."""
    return prefill_seconds(inst[COST_KIND, i], coefs[i], inst[BUDGET, i],
                           np.int64(prefill_work(loads, i)) + inst[ROUTED, i] * prompt
                           + prompt - cached)


@no_alloc_kernel
def least_time(inst: np.ndarray, coefs: np.ndarray, loads: np.ndarray, role: int, prompt: int,
               cached: np.ndarray) -> int:
    """jsq-time's pick in the pool of ``role`` (-1: empty): the least estimated time to
    prefill the instance's pending prompt tokens and this prompt (less what its prefix cache
    holds) on its own cost model, ties by fewer requests held, then the lowest index; a
    decode instance by fewer requests held. Pending and held count the requests routed
    there since the load report (``inst[ROUTED]``: the router's own in-flight accounting, as
    production routers keep it; each counted as this prompt), without which every arrival
    between two reports joins the same queue. With live loads nothing is counted between
    reports, and requests delivered but not yet admitted are not in the loads (as for every
    rule). The queue is priced as one sequence of that many tokens, as Kairos prices TTFT_P."""
    best, t_best, h_best = -1, np.inf, 0.0
    for i in range(inst.shape[1]):
        if inst[ROLE, i] != role:
            continue
        sent = inst[ROUTED, i]
        held = committed(loads, i) + sent
        if role == DECODE:  # (decodes by requests held alone)
            if best < 0 or held < h_best:
                best, h_best = i, held
            continue
        t = queue_seconds(inst, coefs, loads, i, prompt, cached[i])
        if best < 0 or t < t_best or (t == t_best and held < h_best):
            best, t_best, h_best = i, t, held
    return best


@no_alloc_kernel
def prefill_estimate(code: int, cf: np.ndarray, inst: np.ndarray, coefs: np.ndarray,
                     loads: np.ndarray, p: int, prompt: int, cached: int = 0,
                     sent: int = -1) -> float:
    """TTFT_P of prefill instance p, whose prefix cache holds ``cached`` of the prompt's
    tokens (``kairos-transfer``: with its KV transfer, ``sent`` tokens, the prompt by
    default: the decode instance's cache may hold the rest)."""
    backlog = np.int64(prefill_work(loads, p))
    t = prefill_seconds(inst[COST_KIND, p], coefs[p], inst[BUDGET, p],
                        backlog + prompt - cached)
    if code == KAIROS_TRANSFER:
        t += cf[SETUP] + (prompt if sent < 0 else sent) * float(inst[KV_BYTES, p]) / cf[NIC]
    return t


@no_alloc_kernel
def kairos(code: int, cf: np.ndarray, inst: np.ndarray, coefs: np.ndarray,
           loads: np.ndarray, prompt: int, cached: np.ndarray, ttft_target: float,
           tpot_target: float, out: np.ndarray) -> None:
    """Kairos's decision (``cbgym.agents.routing.kairos``), on the tokens each instance's
    prefix cache leaves to compute (``cached``; zeros without caching) and, disaggregated,
    those the decode instance lacks."""
    d_pick = pick(LEAST_OUTSTANDING, inst, loads, DECODE, 0)
    sent = prompt - cached[d_pick] if d_pick >= 0 else prompt
    best_p, ttft_p = -1, np.inf
    for p in range(inst.shape[1]):
        if inst[ROLE, p] == PREFILL:
            t = prefill_estimate(code, cf, inst, coefs, loads, p, prompt, cached[p], sent)
            if t < ttft_p or best_p < 0:  # (argmin's: the first one if none is finite)
                best_p, ttft_p = p, t
    bound = min(cf[ALPHA] * ttft_p, ttft_target)
    best, best_d, best_cap = np.inf, -1, 0
    tbt = cf[BETA] * tpot_target
    for d in range(inst.shape[1]):
        if inst[ROLE, d] != DECODE or not kairos_ok(inst, loads, d, prompt, cached[d]):
            continue
        t, cap = decode_ttft(inst[COST_KIND, d], coefs[d], inst[BUDGET, d],
                             np.int64(loads[D_BATCH, d]), np.int64(loads[D_CTX, d]), prompt,
                             tbt, min(bound, best), cached[d])
        if t < best:
            best, best_d, best_cap = t, d, cap
    if best_d >= 0:  # the walk returned a sum within bound: both tests hold
        out[0], out[1], out[2] = -1, best_d, best_cap
    else:
        out[0], out[1], out[2] = best_p, d_pick, 0


@no_alloc_kernel
def route_rule(code: int, cf: np.ndarray, inst: np.ndarray, coefs: np.ndarray,
               loads: np.ndarray, prompt: int, cached: np.ndarray, ttft_target: float,
               tpot_target: float, count: int, out: np.ndarray) -> bool:
    """Rule ``code``'s route for a request of ``prompt`` tokens, ``cached[i]`` of them in
    instance i's prefix cache (``count``: routes so far, this one included) into ``out``;
    False if the cluster has no pool the rule needs. The disaggregation rules decide on the
    prompt the decode instance would prefill itself: what its cache leaves (Dynamo's
    ``prefill_length - prefix_hit_length`` on the decode worker, llm-d's non-cached suffix
    on the decode pod)."""
    if code == KAIROS or code == KAIROS_TRANSFER:
        kairos(code, cf, inst, coefs, loads, prompt, cached, ttft_target, tpot_target, out)
    elif code == JSQ_TIME:
        if pool_size(inst, UNIFIED) > 0:
            out[0], out[1] = -1, least_time(inst, coefs, loads, UNIFIED, prompt, cached)
        else:
            out[0] = least_time(inst, coefs, loads, PREFILL, prompt, cached)
            out[1] = least_time(inst, coefs, loads, DECODE, prompt, cached)
        out[2] = 0
    elif code <= JSQ_TOKENS:
        if pool_size(inst, UNIFIED) > 0:
            out[0], out[1] = -1, pick(code, inst, loads, UNIFIED, count)
        else:
            out[0] = pick(code, inst, loads, PREFILL, count)
            out[1] = pick(code, inst, loads, DECODE, count)
        out[2] = 0
    else:
        d = pick(LEAST_OUTSTANDING, inst, loads, DECODE, count)
        uncached = prompt - cached[d] if d >= 0 else prompt
        remote = code == ALWAYS or (code == LLM_D and uncached > cf[THRESHOLD])
        if code == DYNAMO:
            queued = 0.0
            for p in range(inst.shape[1]):
                if inst[ROLE, p] == PREFILL:
                    queued += loads[W_N, p]
            remote = uncached > cf[LENGTH] and queued < cf[QUEUE]
        p = least_prefill(inst, loads) if remote else -1
        out[0], out[1], out[2] = p, d, 0
    return out[1] >= 0 and not (out[0] < 0 and inst[ROLE, out[1]] == PREFILL)
