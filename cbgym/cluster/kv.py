"""The KV handoff between a prefill instance P and a decode instance D, in both link modes.

* ``bulk`` (vLLM's NixlConnector): P computes the whole prompt; D receives the request then,
  allocates blocks for the prompt when its scheduler reaches it, and one transfer moves the
  whole prompt's KV.
* ``pipelined`` (per-chunk transfers, as the open layer-/chunk-wise pull requests of vLLM and
  TensorRT-LLM do): D receives the request when it is routed and allocates its blocks then;
  each prompt chunk P computes is sent as soon as D has blocks for it, overlapping P's next
  chunk, so only the last chunk's transfer follows the prefill.

Either way P keeps its blocks until every transfer has landed; D's 1-token step then samples
the first token. A request one side sheds is ended on the other (P's copy freed once nothing
is in flight).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cbgym.engine import handoff
from cbgym.engine import layout as L
from cbgym.engine.jit import bind

if TYPE_CHECKING:
    from cbgym.cluster.cluster import Cluster


class Handoff:
    """Per-request transfer state of one cluster run (arrays indexed by request id)."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        n = len(c.trace)
        self.pipelined = c.config.link.mode == "pipelined"
        self.sent = np.zeros(n, np.int64)  # prompt tokens whose KV is sent or in flight
        self.ready = np.zeros(n, np.int64)  # prompt tokens P has computed (pipelined)
        self.inflight = np.zeros(n, np.int64)
        self.allocated = np.zeros(n, bool)  # D holds blocks for the prompt
        self.p_done = np.zeros(n, bool)
        self.dropped = np.zeros(n, bool)  # ended on one side: no KV is needed any more
        self.tid_rid: dict[int, int] = {}
        self._tid = 0
        s0 = c.engines[0].state
        self._release = bind(handoff.release_kv, s0, 0)
        self._landed = bind(handoff.kv_landed, s0, 0)

    def _engines(self, rid: int) -> tuple[int, int]:
        return int(self.c.prefill_instance[rid]), int(self.c.decode_instance[rid])

    # ------------------------------------------------------------------ from P
    def prefill_progress(self, rid: int, t: float, computed: int, done: bool) -> None:
        """P computed a chunk of ``rid``'s prompt (``done``: its last one) at ``t``."""
        c = self.c
        p, d = self._engines(rid)
        if done:
            self.p_done[rid] = True
            c.prefill_done_s[rid] = t
            c.kv_out[p] += 1
        self.ready[rid] = computed
        if self.dropped[rid]:
            if done and self.inflight[rid] == 0:
                self._free_prefill(rid)
            return
        if not self.pipelined:
            if done:  # D takes it now, its KV still on P
                c.incoming[d] -= 1
                c.give(d, rid, t, int(c.trace.output_tokens[rid]), 0, L.REMOTE_NEW)
            return
        if self.allocated[rid]:
            self._send(rid, t)

    def prefill_shed(self, rid: int, t: float) -> None:
        """P shed ``rid`` (it never fits there): a pipelined D drops its copy."""
        self.dropped[rid] = True
        if self.pipelined:
            p, d = self._engines(rid)
            eng_p, eng_d = self.c.engines[p], self.c.engines[d]
            reason = eng_p.req.reasons[int(eng_p.state.req[L.REASON, rid])]
            handoff.drop(eng_d.state, rid, t, eng_d.reason_code(reason))
            self.c.active[d] = True

    # ------------------------------------------------------------------ from D
    def allocated_on_decode(self, rid: int, t: float) -> None:
        """D holds blocks for ``rid``'s prompt: what P has computed moves now."""
        self.allocated[rid] = True
        self._send(rid, t)

    def decode_shed(self, rid: int) -> None:
        """D shed ``rid``: P's copy is freed once its prefill is done and nothing is in
        flight."""
        self.dropped[rid] = True
        if self.p_done[rid] and self.inflight[rid] == 0:
            self._free_prefill(rid)

    # ------------------------------------------------------------------ the link
    def _send(self, rid: int, t: float) -> None:
        c = self.c
        p, d = self._engines(rid)
        tokens = (int(self.ready[rid]) if self.pipelined else int(c.trace.prompt_tokens[rid]))
        tokens -= int(self.sent[rid])
        if tokens <= 0:
            return
        nbytes = tokens * int(c.engines[p].config.kv_bytes_per_token or 0)
        if np.isnan(c.transfer_start_s[rid]):
            c.transfer_start_s[rid] = t
        c.transfer_bytes[rid] += nbytes
        self.sent[rid] += tokens
        self.inflight[rid] += 1
        self._tid += 1
        self.tid_rid[self._tid] = rid
        c.link.start(self._tid, p, d, float(nbytes), t)

    def landed(self, tid: int, t: float) -> None:
        """Transfer ``tid`` landed at ``t``: once all of a request's KV is on D, P frees its
        copy and D admits the request's 1-token step."""
        c = self.c
        rid = self.tid_rid.pop(tid)
        self.inflight[rid] -= 1
        complete = (self.p_done[rid] and self.inflight[rid] == 0
                    and self.sent[rid] == c.trace.prompt_tokens[rid])
        if self.dropped[rid]:
            if self.p_done[rid] and self.inflight[rid] == 0:
                self._free_prefill(rid)
            return
        if not complete:
            return
        p, d = self._engines(rid)
        c.transfer_end_s[rid] = t
        self._free_prefill(rid)
        self._landed(c.engines[d].state, rid)
        c.active[d] = True

    def _free_prefill(self, rid: int) -> None:
        c = self.c
        p, _ = self._engines(rid)
        self._release(c.engines[p].state, rid)
        c.kv_out[p] -= 1
        c.active[p] = True
