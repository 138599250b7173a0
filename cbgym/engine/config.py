"""Static engine configuration (validated once) and named presets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Literal

import numpy as np

from cbgym.engine.cost_model import CostModel, LinearCostModel

PAPER_PRESET = "cbsjf-paper"
# The CB-SJF-Work study's simulator: Llama-2-13B fp16 on one A100-80GB, KV budget
# (80 GB - 26 GB weights) / 800 KiB per token = 65,917 tokens, at most 256 running requests.
PAPER_KV_TOKENS = 65_917
PAPER_KV_BYTES_PER_TOKEN = 819_200  # 2 (K,V) x 40 layers x 40 heads x 128 dims x 2 bytes
PAPER_COST = LinearCostModel(
    base_s=0.012, prefill_per_token_s=0.00028, decode_per_seq_s=0.00042, prefill_base_s=0.008
)
DEFAULT_PRESET = "llama-2-7b/a100-80gb"

# Count fields: (name, None allowed). Checked before the preset derivation reads them.
_INT_FIELDS = (
    ("max_num_seqs", False),
    ("max_num_batched_tokens", False),
    ("block_size", True),
    ("num_kv_blocks", True),
    ("max_model_len", True),
    ("kv_bytes_per_token", True),
)
_REAL_FIELDS = {
    "gpu_memory_utilization": "a finite real number in (0, 1]",
    "swap_space_gib": "a finite real number >= 0",
}


def _is_int(value: object) -> bool:
    """A Python or numpy integer; bool is an int subclass but never a count."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _is_real(value: object) -> bool:
    """A finite real number (numpy scalars included); bool and str are not numbers here."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range (10**400) is no usable fraction or size
        return False


def parse_preset(preset: str) -> tuple[str, str, int]:
    """Split ``"model/gpu[/tpN]"`` into (model, gpu, tensor-parallel degree)."""
    parts = preset.split("/")
    tp = 1
    if len(parts) == 3 and parts[2].startswith("tp") and parts[2][2:].isdigit():
        tp = int(parts[2][2:])
        parts = parts[:2]
    if len(parts) != 2 or not all(parts):
        raise ValueError(
            f"EngineConfig.preset={preset!r}: expected 'model/gpu' or 'model/gpu/tpN' "
            f"(e.g. 'llama-2-7b/a100-80gb', 'llama-2-70b/a100-80gb/tp4') or {PAPER_PRESET!r}"
        )
    return parts[0], parts[1], tp


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the simulated serving instance is built. Validated in ``__post_init__``.

    ``None`` fields are derived from the preset: the cost model, the KV capacity (from model
    weights, GPU memory and ``gpu_memory_utilization``) and the KV bytes per token (for swap).
    The ``cbsjf-paper`` preset selects the CB-SJF-Work study's engine mode: separate prefill and
    decode iterations, KV reserved for prompt + true output at admission, no chunking, no
    preemption, its linear cost constants and a 65,917-token KV budget (block size 1).
    """

    # "model/gpu[/tpN]" (roofline cost model + KV capacity), "cbsjf-paper", or None (then
    # cost_model and num_kv_blocks must be given)
    preset: str | None = DEFAULT_PRESET
    # cap on running requests (vLLM max_num_seqs)
    max_num_seqs: int = 256
    # token budget per iteration (vLLM max_num_batched_tokens); unused in cbsjf-paper mode
    max_num_batched_tokens: int = 2048
    # tokens per KV block; default 16 (vLLM), 1 in cbsjf-paper mode
    block_size: int | None = None
    # usable KV blocks; None = derived from the preset
    num_kv_blocks: int | None = None
    # split long prompts across iterations (vLLM default on)
    chunked_prefill: bool = True
    # what happens to a preempted request's KV: dropped and recomputed, or swapped to host
    preemption: Literal["recompute", "swap"] = "recompute"
    # iteration cost model; None = the preset's
    cost_model: CostModel | None = None
    # fraction of GPU memory vLLM may use (weights + activations + KV)
    gpu_memory_utilization: float = 0.9
    # longest sequence (prompt + output) served; None = the model's context length for a
    # hardware preset (as vLLM derives it), unbounded for cbsjf-paper or preset=None
    max_model_len: int | None = None
    # host memory for swapped-out KV (vLLM v0 swap_space default 4 GiB)
    swap_space_gib: float = 4.0
    # KV bytes per token (swap traffic); None = from the preset's model
    kv_bytes_per_token: int | None = None
    # vLLM's automatic prefix caching (cbgym.engine.prefix_cache): on a trace with block ids
    # (trace.extra["hash_ids"]); without them a run is as with it off
    enable_prefix_caching: bool = False
    # cache_salt per tenant: equal prefixes of different tenants are not shared (vLLM's
    # per-request cache_salt, which keeps one tenant from timing another's cache)
    cache_salt_by_tenant: bool = False
    # derived: "vllm" or "cbsjf-paper"
    mode: str = field(init=False, default="vllm")

    def __post_init__(self) -> None:
        s = object.__setattr__
        # types first: the preset derivation does arithmetic with block_size and friends, and a
        # str there would fail deep inside hardware.py instead of naming the field
        self._check_types()
        if self.preset == PAPER_PRESET:
            s(self, "mode", PAPER_PRESET)
            self._fill(
                block_size=1,
                num_kv_blocks=None,
                cost_model=PAPER_COST,
                kv_bytes_per_token=PAPER_KV_BYTES_PER_TOKEN,
            )
            if self.num_kv_blocks is None:
                s(self, "num_kv_blocks", -(-PAPER_KV_TOKENS // self.block_size))
        elif self.preset is not None:
            self._fill_from_hardware(self.preset)
        else:
            self._fill(block_size=16, num_kv_blocks=None, cost_model=None, kv_bytes_per_token=None)
            if self.cost_model is None or self.num_kv_blocks is None:
                raise ValueError(
                    "EngineConfig(preset=None) needs both cost_model= and num_kv_blocks="
                )
        self._validate()

    def _fill(self, **defaults: object) -> None:
        for name, value in defaults.items():
            if getattr(self, name) is None and value is not None:
                object.__setattr__(self, name, value)

    def _fill_from_hardware(self, preset: str) -> None:
        from cbgym.engine.hardware import GPUS, MODELS, kv_cache_blocks
        from cbgym.engine.roofline import RooflineCostModel

        model_name, gpu_name, tp = parse_preset(preset)
        if model_name not in MODELS:
            raise ValueError(
                f"EngineConfig.preset={preset!r}: unknown model {model_name!r}; "
                f"known: {', '.join(sorted(MODELS))}"
            )
        if gpu_name not in GPUS:
            raise ValueError(
                f"EngineConfig.preset={preset!r}: unknown GPU {gpu_name!r}; "
                f"known: {', '.join(sorted(GPUS))}"
            )
        model = MODELS[model_name]
        # vLLM defaults max_model_len to the model's max_position_embeddings; an explicit value
        # (even a larger one, which vLLM allows with VLLM_ALLOW_LONG_MAX_MODEL_LEN) is kept
        self._fill(
            block_size=16,
            kv_bytes_per_token=model.kv_bytes_per_token,
            max_model_len=model.max_position_embeddings,
        )
        if self.cost_model is None:
            object.__setattr__(self, "cost_model", RooflineCostModel.from_preset(preset))
        if self.num_kv_blocks is None:
            blocks = kv_cache_blocks(
                model,
                GPUS[gpu_name],
                tp,
                block_size=self.block_size,
                gpu_memory_utilization=self.gpu_memory_utilization,
            )
            object.__setattr__(self, "num_kv_blocks", blocks)

    def _check_types(self) -> None:
        """Reject wrong types (2.5 blocks, "100", "False") and normalise numpy scalars."""
        s = object.__setattr__
        if self.preset is not None and not isinstance(self.preset, str):
            raise _bad(self, "preset", f"None, {PAPER_PRESET!r} or a 'model/gpu' string")
        for name, optional in _INT_FIELDS:
            value = getattr(self, name)
            if value is None and optional:
                continue
            if not _is_int(value):
                raise _bad(self, name, ("None or " if optional else "") + "an integer")
            s(self, name, int(value))  # numpy ints become ints, so downstream sees plain int
        # a non-empty string such as "False" is truthy: only real booleans are flags
        if not isinstance(self.chunked_prefill, bool | np.bool_):
            raise _bad(self, "chunked_prefill", "a bool (True or False)")
        s(self, "chunked_prefill", bool(self.chunked_prefill))
        for name in ("enable_prefix_caching", "cache_salt_by_tenant"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise _bad(self, name, "a bool (True or False)")
            s(self, name, bool(getattr(self, name)))
        for name, expected in _REAL_FIELDS.items():
            if not _is_real(getattr(self, name)):
                raise _bad(self, name, expected)
            s(self, name, float(getattr(self, name)))

    def _validate(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return _bad(self, name, expected)

        assert self.block_size is not None and self.num_kv_blocks is not None
        if self.max_num_seqs < 1:
            raise bad("max_num_seqs", "an integer >= 1")
        if self.block_size < 1:
            raise bad("block_size", "an integer >= 1")
        if self.num_kv_blocks < 1:
            raise bad("num_kv_blocks", "at least one block")
        if self.mode == "vllm" and self.max_num_batched_tokens < self.block_size:
            raise bad("max_num_batched_tokens", f"at least one block ({self.block_size} tokens)")
        if self.preemption not in ("recompute", "swap"):
            raise bad("preemption", "'recompute' or 'swap'")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise bad("gpu_memory_utilization", "a fraction in (0, 1]")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise bad("max_model_len", "None or an integer >= 2")
        if self.kv_bytes_per_token is not None and self.kv_bytes_per_token < 1:
            raise bad("kv_bytes_per_token", "None or an integer >= 1")
        if self.swap_space_gib < 0:
            raise bad("swap_space_gib", ">= 0")
        if self.enable_prefix_caching and self.mode != "vllm":
            raise bad("enable_prefix_caching", "False in the study's engine mode (cbsjf-paper "
                      "reserves prompt + output blocks and has no named blocks)")
        if self.enable_prefix_caching and self.preemption == "swap":
            raise bad("enable_prefix_caching", "False with preemption='swap' (vLLM v1 "
                      "recomputes; swapping cached blocks is not modelled)")
        if not isinstance(self.cost_model, CostModel):
            raise bad("cost_model", "LinearCostModel, RooflineCostModel or TableCostModel (a "
                      "model of your own GPU: TableCostModel.from_csv of a profiling table, or "
                      "the coefficients of one of these)")

    @property
    def kv_capacity_tokens(self) -> int:
        """KV capacity in tokens (blocks x block size)."""
        assert self.num_kv_blocks is not None and self.block_size is not None
        return self.num_kv_blocks * self.block_size

    @property
    def paper_mode(self) -> bool:
        return self.mode == PAPER_PRESET


def _bad(config: EngineConfig, name: str, expected: str) -> ValueError:
    return ValueError(f"EngineConfig.{name}={getattr(config, name)!r}: expected {expected}")
