"""The kernel's data: static parameters apart from mutable state (gymnax's split).

:class:`Params` is what an :class:`~cbgym.engine.EngineConfig` compiles to: integer settings
in ``ci`` and the cost model's coefficients in ``cost``; nothing in it changes during a run.
:class:`State` is everything a run mutates, as numpy arrays (so the Python side reads it
without copies and it pickles as it is): per-request columns indexed by request id, the
queues as id arrays with their lengths in ``si``, the standing decision, and the buffers the
time series and batch log are written to. Scalars live in the small arrays ``si`` (int64) and
``sf`` (float64) under the names below, because a numba tuple of arrays is immutable but the
arrays in it are not.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cbgym.engine import gaps, itl
from cbgym.engine.jit import no_alloc_kernel


def _codes(n: int) -> tuple[np.int64, ...]:
    """n consecutive int64 constants. numpy ints, not Python ints: numba types a Python int
    global as a literal and compiles every kernel it is passed to once per literal value."""
    return tuple(np.int64(i) for i in range(n))


# ---------------------------------------------------------------- ci: static settings (int64)
(PAPER, BUDGET, MAX_SEQS, BLOCK_SIZE, NUM_BLOCKS, CHUNKED, MAX_MODEL_LEN, SWAP, KV_BYTES,
 CONSULT, KEYED, RECORD, COST_KIND, STRETCH, VICTIM_BY_KEY, PREFIX) = _codes(16)
NUM_CI = 16
# PREFIX: vLLM's automatic prefix caching (cbgym.engine.prefix_cache): blocks are named
# VICTIM_BY_KEY: the default victim is the running request with the largest static key (the
# first of equals, in running order), as vLLM's priority policy, instead of the last admitted
# when the engine stops to ask for a decision (cbgym.engine.Policy.consult)
CONSULT_MODES = ("never", "on_change", "on_completion", "every_iteration", "always")
NEVER, ON_CHANGE, ON_COMPLETION, EVERY_ITERATION, ALWAYS = _codes(5)

# ---------------------------------------------------------------- si: int64 scalars
(N_RUN, N_WAIT, NEXT_ARRIVAL, FREE, ITERATION, TOTAL_PREEMPT, NUM_FINISHED, NUM_ENDED,
 IDLE_TICKS, HOST_FREE, SWAP_BYTES, PREEMPTED_NOW, REC_N, BLOG_N, PLOG_N, CHANGED, SHORTFALL,
 PLAN_TOTAL, PLAN_DECODING, PLAN_VALID, STAND_N, STAND_HAS, VICT_N, VICT_HAS,
 ROW_OPEN, PLAN_LEFT, PLAN_CTX, INBOX_N, OUTBOX_N, IDLED, KERNEL_POLICY, GAP_TOP,
 P99_ON, PC_QUERIES, PC_HITS, PC_PRE_QUERIES, PC_PRE_HITS, PC_EVICTED, TURNS_N) = _codes(39)
NUM_SI = 39
# TURNS_N: closed-loop sessions: ended requests whose next turn is still to be sent
# (ids[TURNS]; sent at the next admission of arrivals, cbgym.engine.transitions)
# PC_*: prefix-cache counters in tokens, as vLLM's PrefixCacheStats: queries and hits of
# requests looked up for the first time (vllm:prefix_cache_queries / _hits), of preempted
# ones looking up again (PRE), and cached blocks evicted for reuse
# GAP_TOP: the most gaps a request keeps (cbgym.engine.gaps), a stretch's scratch size;
# P99_ON: requests keep the gaps their p99 needs (else only their worst), and the run its
# pooled histogram of gaps (sf[ITL:])
# KERNEL_POLICY: a cluster's instance whose local policy is decided in the kernel (FCFS or a
# static key): idle, it waits for its cluster's next event instead of ticking
# IDLED: the last iteration scheduled nothing (and nothing was delivered since): with the
# policy decided in the kernel, only an event of its cluster can make it do something
# ---------------------------------------------------------------- sf: float64 scalars
# UNTIL: the horizon (an instance of a cluster stops before an iteration that would start
# at or after it; +inf for a standalone engine)
# ITL: where the run's histogram of gaps between tokens starts (cbgym.engine.itl; it fills
# the rest of ``sf``: a State field of its own slowed every run by about 10%, since each
# kernel call passes every array of the State)
NOW, LAST_DT, UNTIL, ITL = _codes(4)
NUM_SF = 3 + itl.SLOTS

# ---------------------------------------------------------------- codes
# request status (cbgym.engine.Status)
PENDING, WAITING, RUNNING, FINISHED, SHED = _codes(5)
# what a kernel call stopped at (AT_HORIZON: the clock reached sf[UNTIL], or the instance
# has outbox events for its cluster; TURNS_DUE: closed-loop sessions have next turns to send,
# before the next admission: the caller sends them (kutil.send_turns) and advances on;
# TURNS_IDLE: the same from an idle iteration, which then lets time pass unless a turn is
# due now (execute.idle_after_turns). A stop, not a call in the loop: the send's code
# reachable from every iteration's admission slowed every run by about 10%)
AT_DECISION, DRAINED, NEED_ROOM, TOO_MANY_IDLE_TICKS, AT_HORIZON, TURNS_DUE, TURNS_IDLE = (
    _codes(7))
# flags passed between kernels: numpy bools, never a Python literal (see _codes)
YES, NO = np.bool_(True), np.bool_(False)
# KEEP_KV values: a prefill instance's request keeps its blocks after it ends (BULK); with a
# pipelined link it also reports each prompt chunk it computes (PIPELINED); 0 for any other
NO_KEEP, BULK, PIPELINED = _codes(3)
# RANK values: where a delivery goes among the inbox's deliveries of the same instant
EVENT_RANK, ARRIVAL_RANK = _codes(2)
NO_CAP = np.int64(0)  # CHUNK_CAP: the budget's
# where a request's KV comes from on a decode instance (State.req[REMOTE]): computed here
# (LOCAL), or by a prefill instance and sent over: NEW (no blocks yet), PENDING (blocks for
# the whole prompt held, the transfer in flight: vLLM's WAITING_FOR_REMOTE_KVS), READY
# (landed: it is admitted with all but the last prompt token computed)
LOCAL, REMOTE_NEW, REMOTE_PENDING, REMOTE_READY = _codes(4)
# why a request ended; 0 = plain "finished". Codes from len(REASONS) on are a run's own
# shed reasons (Decision.shed_reason strings), numbered by the Engine as they appear.
REASONS = ("", "kv_reservation_exceeds_capacity", "prompt_exceeds_max_model_len",
           "prompt_exceeds_kv_capacity", "prompt_exceeds_token_budget", "kv_capacity_exceeded",
           "max_model_len", "shed_by_agent", "shed_by_policy", "expired_queue_ttl",
           "aborted_client_timeout")
(R_RESERVATION, R_PROMPT_MML, R_PROMPT_KV, R_PROMPT_BUDGET, R_KV_EXCEEDED, R_MML,
 R_AGENT, R_POLICY, R_EXPIRED, R_ABORTED) = _codes(11)[1:]

# With nothing running and every waiting request held back, time moves by this much per
# idle tick; after MAX_IDLE_TICKS ticks in a row (1,000 simulated seconds) the run is stuck.
IDLE_TICK_S = 0.01
MAX_IDLE_TICKS = np.int64(100_000)

# the time series: one row per iteration, or per run of identical decode iterations
REC_COLUMNS = ("start_s", "duration_s", "num_waiting", "num_running", "kv_blocks_used",
               "num_tokens", "prefill_tokens", "decode_seqs", "num_preemptions",
               "num_iterations")
REC_ROWS = 4096  # rows buffered in the kernel before they move to the Python recorder
LOG_ROWS = 8192  # batch-log rows buffered (record_iterations=True)


class Params(NamedTuple):
    """Static parameters of one engine (never written by the kernel)."""

    ci: np.ndarray  # int64 settings, indexed by the ci names above
    cost: np.ndarray  # float64 cost-model coefficients (cbgym.engine.pricing)


# ---------------------------------------------------------------- State.req rows (int64)
(PROMPT, OUTPUT, TOKENS, COMPUTED, GENERATED, HOST_TOKENS, PREEMPTIONS, HELD, STATUS,
 REASON, KEEP_KV, REMOTE, CHUNK_CAP, RANK, GAP, TABLE, N_CACHED, CACHED, LOOKUP,
 NEXT_TURN) = _codes(20)
NUM_REQ_ROWS = 20
# ---------------------------------------------------------------- State.times rows (float64)
(ARRIVAL, FIRST_SCHEDULED, FIRST_TOKEN, FINISH, KEY, KV_EVENT, LAST_TOKEN, ITL_MAX,
 ITL_P99, GAP_MIN, THINK) = _codes(11)
NUM_TIME_ROWS = 11
# ---------------------------------------------------------------- State.ids rows (int64)
(RUN_Q, WAIT_Q, FINISH_ORDER, STAND_ORDER, STAND_VICTIMS, PLAN_TOKENS, PLAN_NEED, SCHED_IDS,
 SCHED_TOKENS, ORDER, NEVER_FIT, SAMPLED, SCRATCH, INBOX, OUTBOX, TURNS) = _codes(16)
NUM_ID_ROWS = 16
# ---------------------------------------------------------------- State.blocks rows (int64)
# per named block: references (requests holding it), its hash and whether it has one (in the
# cache), its neighbours in the free queue (the last column is the queue's sentinel) and the
# next block with the same hash (vLLM keeps duplicates)
(B_REF, B_HASH, B_HASHED, B_PREV, B_NEXT, B_SAME) = _codes(6)
NUM_BLOCK_ROWS = 6


class State(NamedTuple):
    """Everything one engine run mutates (arrays, changed in place).

    Per-request columns are rows of three 2-D arrays, one per dtype, because numba's cost of
    compiling a function grows with the number of arrays it is handed; a kernel names the
    rows it uses first (``computed = s.req[COMPUTED]``) and then reads like the Python it is.
    """

    # per request, indexed by id (trace order): PROMPT, OUTPUT (the true output length,
    # never shown to policies), TOKENS (prompt + generated), COMPUTED (tokens whose KV is
    # computed), GENERATED, HOST_TOKENS (KV tokens swapped out to host), PREEMPTIONS,
    # HELD (KV blocks), STATUS (codes above), REASON (codes into REASONS); for a cluster's
    # instances: KEEP_KV (1: a prefill instance's request, whose blocks outlive it until its
    # KV has been sent), REMOTE (LOCAL ... REMOTE_READY above), RANK (where a delivery
    # goes among the inbox's deliveries of the same instant: 0 before 1), CHUNK_CAP (most prompt
    # tokens per iteration; 0: the budget's); GAP (its run of largest gaps between tokens
    # in ``gaps``: where, how large, how full, packed by cbgym.engine.gaps.pack); with
    # prefix caching: TABLE (where its block table starts in ``tables``), N_CACHED (its
    # leading blocks registered in the cache, vLLM's num_cached_block) and CACHED (the
    # prompt tokens its first admission found cached, vLLM's num_cached_tokens) and LOOKUP
    # (a waiting request's tokens the cache holds now, probed at a decision point);
    # NEXT_TURN: a closed-loop session's next request, sent THINK seconds after this one
    # ends (-1: none; cbgym.engine.sessions)
    req: np.ndarray
    # per request: ARRIVAL (at this instance), FIRST_SCHEDULED, FIRST_TOKEN, FINISH
    # (seconds; NaN: not yet), KEY (a static policy's key: lower admitted first), KV_EVENT
    # (when its last outbox event happened), LAST_TOKEN (when it sampled its last token),
    # ITL_MAX / ITL_P99 (its longest gap between two tokens and the p99 of its gaps, numpy's
    # linear method; set when it ends, 0 without a gap), GAP_MIN (the least gap its run of
    # largest gaps keeps once full, -inf before: a smaller gap is not kept)
    times: np.ndarray
    # id lists, each n long:
    #   RUN_Q (running, admission order; first si[N_RUN]), WAIT_Q (waiting, queue order;
    #   first si[N_WAIT]), FINISH_ORDER (finished ids in completion order),
    #   STAND_ORDER / STAND_VICTIMS (the standing decision, re-applied until the policy is
    #   asked again; si[STAND_N], si[VICT_N]),
    #   and one iteration's scratch: PLAN_TOKENS / PLAN_NEED (per running slot: tokens the
    #   running loop grants and new KV blocks for them), SCHED_IDS / SCHED_TOKENS (the
    #   batch), ORDER (admission candidates), NEVER_FIT, SAMPLED (per batch slot: 1 if it
    #   samples a token), SCRATCH (sorting),
    #   INBOX (ids in the order they arrive here, by arrival time; first si[INBOX_N]: every
    #   request for a standalone engine, the routed ones for a cluster's instance), OUTBOX
    #   (ids with an event the cluster must act on, first si[OUTBOX_N]: a prefill done with
    #   KEEP_KV, or a REMOTE request's blocks allocated, at times[KV_EVENT])
    ids: np.ndarray
    si: np.ndarray  # int64 scalars (names above)
    sf: np.ndarray  # float64 scalars
    rec: np.ndarray  # (REC_ROWS, len(REC_COLUMNS)) time-series rows; first si[REC_N]
    blog: np.ndarray  # (rows, 3) batch log: iteration, request id, tokens; first si[BLOG_N]
    plog: np.ndarray  # (rows, 2) preemptions: iteration, request id; first si[PLOG_N]
    slots: np.ndarray  # (block_size,) scratch: running requests by free slots in last block
    gaps: np.ndarray  # each request's largest gaps between tokens (cbgym.engine.gaps)
    # prefix caching (cbgym.engine.prefix_cache; one column each when it is off):
    blocks: np.ndarray  # (NUM_BLOCK_ROWS, num_blocks + 1) the named blocks and the free queue
    cache: np.ndarray  # (2, capacity) the hash map: block hash -> first block holding it
    tables: np.ndarray  # (2, sum of blocks) per request: its block ids, its block hashes


def new_state(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray,
              num_blocks: int, host_free_tokens: int, max_seqs: int,
              block_size: int, routed: bool = False, out: State | None = None,
              p99: bool = True, prefix_hashes: np.ndarray | None = None) -> State:
    """A fresh run's state. Every array is C-contiguous and writeable, so a state always has
    the same numba type (an unpickled one included). ``routed``: an instance of a cluster,
    whose requests arrive only when delivered (an empty inbox). ``out``: arrays to start the
    run in instead of new ones (a cluster's instance: views into its batched state), at
    least as large as these would be. ``p99``: keep what each request's p99 gap needs
    (``itl_p99_s``); else only its worst gap, cheaper (the study's engine mode).
    ``prefix_hashes``: every request's block hashes (``prefix_hashes.block_hashes``): prefix
    caching on, blocks named."""
    from cbgym.engine import prefix_cache as pc  # (it imports this module)

    n = len(arrival_s)
    log_rows = max(LOG_ROWS, 4 * max_seqs)
    if p99 and n and gaps.keep(int(np.max(output))) > gaps.MASK:
        j = int(np.argmax(output))
        raise ValueError(f"request {j}: {int(output[j])} output tokens, more than its p99 gap "
                         "slots hold (13M); pass itl_p99=False")
    if out is not None:
        if (out.req.shape != (NUM_REQ_ROWS, n) or len(out.blog) < log_rows
                or len(out.slots) < block_size or len(out.gaps) < gaps.slots(output)):
            raise ValueError("new_state: out= arrays too small for this run")
        s = out
    else:
        s = State(np.zeros((NUM_REQ_ROWS, n), np.int64), np.zeros((NUM_TIME_ROWS, n)),
                  np.zeros((NUM_ID_ROWS, n), np.int64),
                  np.zeros(NUM_SI, np.int64), np.zeros(NUM_SF),
                  np.zeros((REC_ROWS, len(REC_COLUMNS))), np.zeros((log_rows, 3), np.int64),
                  np.zeros((log_rows, 2), np.int64), np.zeros(block_size, np.int64),
                  np.zeros(gaps.slots(output)),
                  *(pc.no_pool() if prefix_hashes is None else
                    pc.empty_pool(num_blocks, len(prefix_hashes))))
    fill_state(s, np.ascontiguousarray(arrival_s, dtype=np.float64),
               np.ascontiguousarray(prompt, dtype=np.int64),
               np.ascontiguousarray(output, dtype=np.int64), np.int64(num_blocks),
               np.int64(host_free_tokens), p99)
    if routed:
        s.si[INBOX_N] = 0
    if prefix_hashes is not None:
        if s.blocks.shape[1] < num_blocks + 1 or s.tables.shape[1] < len(prefix_hashes):
            raise ValueError("new_state: out= prefix-cache arrays do not fit this run")
        pc.reset_pool(s, np.int64(num_blocks), pc.table_offsets(prompt, output, block_size),
                      np.ascontiguousarray(prefix_hashes, np.int64))
    return s


@no_alloc_kernel
def fill_state(s: State, arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray,
               num_blocks: int, host_free_tokens: int, p99: bool) -> None:
    """Start a run in ``s``'s arrays (sized for these requests): nothing has arrived, every
    block is free, every request will arrive at its time (the inbox holds them all, in
    order), no horizon. The one way a run starts, for an engine and for each env of a batch.
    ``s.gaps`` must hold at least ``gaps.slots(output)``; ``p99``: as :func:`new_state`'s."""
    req, times, ids = s.req, s.times, s.ids
    n = len(arrival_s)
    # row by row: each row is contiguous (a request's fields are a column)
    for r in range(req.shape[0]):
        for j in range(n):
            req[r, j] = 0
    for r in range(ids.shape[0]):
        for j in range(n):
            ids[r, j] = 0
    for r in range(times.shape[0]):
        for j in range(n):
            times[r, j] = np.nan
    for j in range(n):
        req[NEXT_TURN, j] = -1
        req[PROMPT, j] = prompt[j]
        req[OUTPUT, j] = output[j]
        req[TOKENS, j] = prompt[j]
        times[ARRIVAL, j] = arrival_s[j]
        times[KEY, j] = 0.0
        times[ITL_MAX, j] = 0.0
        times[GAP_MIN, j] = -np.inf
        ids[INBOX, j] = j
    top = 1
    for j in range(n):
        top = max(top, gaps.keep(output[j]) if p99 else 1)
    off = top  # (the first ``top`` slots: a decode stretch's scratch)
    if top > gaps.MASK:
        raise ValueError("fill_state: an output too long for its p99 gap slots (13M tokens)")
    for j in range(n):
        k = gaps.keep(output[j]) if p99 else 1
        req[GAP, j] = gaps.pack(off, k, 0)
        off += k
    if off >= gaps.MAX_OFFSET:
        raise ValueError("fill_state: too many p99 gap slots for one run (2**29)")
    if off > len(s.gaps):
        raise ValueError("fill_state: State.gaps is shorter than gaps.slots(output)")
    for k in range(len(s.si)):
        s.si[k] = 0
    if p99 and len(s.sf) < NUM_SF:
        raise ValueError("fill_state: State.sf has no room for the ITL histogram (NUM_SF)")
    for k in range(len(s.sf) if p99 else ITL):  # (the histogram is read only with p99)
        s.sf[k] = 0.0
    for k in range(len(s.slots)):
        s.slots[k] = 0
    s.si[FREE] = num_blocks
    s.si[HOST_FREE] = host_free_tokens
    s.si[CHANGED] = 1
    s.si[INBOX_N] = n
    s.si[GAP_TOP] = top
    s.si[P99_ON] = p99
    s.sf[UNTIL] = np.inf
