"""Model and GPU descriptions, and the KV-cache capacity they leave.

All quantities are in SI units unless a name says otherwise: bytes, FLOP/s, bytes/s.
``GiB`` (2**30 bytes) appears only where a figure is quoted the way CUDA reports it.

Sources for the constants: NVIDIA A100/H100/H200 datasheets (dense BF16 tensor-core peak,
HBM bandwidth, NVLink and PCIe generation) and the Hugging Face ``config.json`` of each model
(layers, hidden size, heads, vocabulary, MLP width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

GiB = 2**30  # bytes
KiB = 2**10  # bytes


def _finite_real(value: object) -> bool:
    """A finite real number; bool and str are not (math.isfinite would take True or raise)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only transformer (Llama-style: gated MLP, grouped-query attention).

    Args:
        name: Short identifier, e.g. ``"llama-2-7b"``.
        num_params: Total parameter count, embeddings and LM head included.
        num_layers: Transformer blocks.
        hidden_size: Residual-stream width.
        num_heads: Query heads per layer.
        num_kv_heads: Key/value heads per layer (``< num_heads`` for grouped-query attention).
        vocab_size: Vocabulary size (rows of the embedding and of the LM head).
        intermediate_size: Width of the gated MLP (each of gate, up and down projections).
        head_dim: Width of one attention head.
        dtype_bytes: Bytes per weight and per KV element (2 for bf16/fp16).
        max_position_embeddings: Context length from the model's ``config.json``; vLLM's
            default ``max_model_len``. ``None`` when unknown (no default cap).
    """

    name: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    intermediate_size: int
    head_dim: int = 128
    dtype_bytes: int = 2
    max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ModelSpec.name must be a non-empty string")
        if not (_finite_real(self.num_params) and self.num_params > 0):
            raise ValueError(
                f"ModelSpec.num_params must be a finite number > 0, got {self.num_params!r}"
            )
        for field_name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "vocab_size",
            "intermediate_size",
            "head_dim",
            "dtype_bytes",
        ):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelSpec.{field_name} must be a positive int, got {value!r}")
        ctx = self.max_position_embeddings
        if ctx is not None and (not isinstance(ctx, int) or isinstance(ctx, bool) or ctx < 2):
            raise ValueError(
                f"ModelSpec.max_position_embeddings must be None or an int >= 2, got {ctx!r}"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"ModelSpec.num_kv_heads ({self.num_kv_heads}) must divide "
                f"num_heads ({self.num_heads})"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V cached per token, over all layers: 2 * L * H_kv * d * bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (embeddings and LM head included)."""
        return self.num_params * self.dtype_bytes

    @property
    def linear_params(self) -> int:
        """Parameters of the per-token matmuls in the transformer blocks.

        Q, K, V and O projections plus the three MLP projections, summed over layers. Excludes
        the embedding (a lookup, no FLOPs) and the LM head (run only for sampled rows).
        """
        q_width = self.num_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        attn = self.hidden_size * (2 * q_width + 2 * kv_width)  # q, o and k, v projections
        mlp = 3 * self.hidden_size * self.intermediate_size  # gate, up, down
        return self.num_layers * (attn + mlp)

    @property
    def lm_head_params(self) -> int:
        """Parameters of the LM head (hidden -> vocabulary logits)."""
        return self.hidden_size * self.vocab_size


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator.

    Args:
        name: Short identifier, e.g. ``"a100-80gb"``.
        peak_flops: Dense BF16 tensor-core peak, FLOP/s (no sparsity).
        mem_bandwidth: HBM bandwidth, bytes/s.
        memory_bytes: Device memory as CUDA reports it (``torch`` ``total_memory``), bytes.
        interconnect_bytes_per_s: NVLink bandwidth per GPU per direction, bytes/s (used by
            tensor-parallel all-reduce).
        host_link_bytes_per_s: Effective host link (PCIe) bandwidth, bytes/s (used by swap).
    """

    name: str
    peak_flops: float
    mem_bandwidth: float
    memory_bytes: float
    interconnect_bytes_per_s: float
    host_link_bytes_per_s: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("GpuSpec.name must be a non-empty string")
        for field_name in (
            "peak_flops",
            "mem_bandwidth",
            "memory_bytes",
            "interconnect_bytes_per_s",
            "host_link_bytes_per_s",
        ):
            value = getattr(self, field_name)
            if not (_finite_real(value) and value > 0):
                raise ValueError(
                    f"GpuSpec.{field_name} must be a finite number > 0, got {value!r}"
                )


def _llama(
    name: str,
    params: float,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    inter: int,
    context: int,
) -> ModelSpec:
    return ModelSpec(
        name, params, layers, hidden, heads, kv_heads, vocab, inter,
        max_position_embeddings=context,
    )


# The last argument is max_position_embeddings from each model's Hugging Face config.json
# (meta-llama/Llama-2-{7b,13b,70b}-hf: 4096; meta-llama/Meta-Llama-3-{8B,70B}: 8192;
# mistralai/Mistral-7B-v0.1: 32768; its 4096-token sliding window bounds attention, not length).
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # KV per token: 2*32*32*128*2 = 512 KiB
        _llama("llama-2-7b", 6.74e9, 32, 4096, 32, 32, 32000, 11008, 4096),
        # KV per token: 2*40*40*128*2 = 800 KiB
        _llama("llama-2-13b", 13.0e9, 40, 5120, 40, 40, 32000, 13824, 4096),
        # KV per token: 2*32*8*128*2 = 128 KiB
        _llama("llama-3-8b", 8.03e9, 32, 4096, 32, 8, 128256, 14336, 8192),
        # KV per token: 2*80*8*128*2 = 320 KiB
        _llama("llama-2-70b", 68.98e9, 80, 8192, 64, 8, 32000, 28672, 4096),
        _llama("llama-3-70b", 70.55e9, 80, 8192, 64, 8, 128256, 28672, 8192),
        _llama("mistral-7b", 7.24e9, 32, 4096, 32, 8, 32000, 14336, 32768),
    )
}

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # NVLink 3: 600 GB/s bidirectional = 300 GB/s per direction; PCIe Gen4 x16 ~25 GB/s
        # effective. 79.15 GiB is what CUDA reports for the 80 GB part.
        GpuSpec("a100-80gb", 312e12, 2.039e12, 79.15 * GiB, 300e9, 25e9),
        GpuSpec("a100-40gb", 312e12, 1.555e12, 39.39 * GiB, 300e9, 25e9),
        # SXM5: NVLink 4 900 GB/s bidirectional; PCIe Gen5 x16 ~50 GB/s effective.
        GpuSpec("h100-80gb", 989e12, 3.35e12, 79.1 * GiB, 450e9, 50e9),
        # Same compute and links as H100 SXM; 141 GB HBM3e at 4.8 TB/s (139.8 GiB visible).
        GpuSpec("h200", 989e12, 4.8e12, 139.8 * GiB, 450e9, 50e9),
    )
}

# vLLM profiles peak activation memory with a dummy forward of max_num_batched_tokens tokens;
# 2048 is its A100 default (the reference engine notes). Used only by the default estimate.
_PROFILE_TOKENS = 2048
_PROFILE_SEQS = 256  # max_num_seqs default: rows whose fp32 logits the sampler materialises
_NON_TORCH_BYTES = 512 * 2**20  # cuBLAS workspaces, NCCL buffers, CUDA graphs (rough)


def check_tp(model: ModelSpec, tp: int) -> None:
    """Raise ValueError unless ``tp`` can shard ``model`` the way vLLM requires.

    Query heads must split evenly, and KV heads must either split evenly or be replicated
    (``tp`` a multiple of the KV-head count).
    """
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp must be a positive int, got {tp!r}")
    if model.num_heads % tp != 0:
        raise ValueError(f"tp={tp} must divide num_heads={model.num_heads} of {model.name}")
    kv = model.num_kv_heads
    if kv % tp != 0 and tp % kv != 0:
        raise ValueError(
            f"tp={tp} must divide, or be a multiple of, num_kv_heads={kv} of {model.name}"
        )


def kv_shard_fraction(model: ModelSpec, tp: int) -> float:
    """Fraction of each token's KV bytes one GPU holds under tensor parallelism ``tp``.

    KV heads are split across GPUs; when ``tp`` exceeds the KV-head count each GPU keeps one
    (replicated) head, as vLLM does.
    """
    return max(model.num_kv_heads // tp, 1) / model.num_kv_heads


def estimate_activation_bytes(model: ModelSpec, tp: int = 1) -> float:
    """Rough per-GPU peak of non-weight, non-KV memory during vLLM's profiling forward pass.

    Counts the widest per-token transients (residual in and out, the gated-MLP input and its
    activation) over ``_PROFILE_TOKENS`` tokens, the sampler's fp32 logits for
    ``_PROFILE_SEQS`` rows, and a fixed allowance for memory outside PyTorch's allocator.

    Args:
        model: The model.
        tp: Tensor-parallel degree (MLP and vocabulary are sharded across GPUs).

    Returns:
        Bytes per GPU.
    """
    per_token = (2 * model.hidden_size + 3 * model.intermediate_size / tp) * model.dtype_bytes
    logits = _PROFILE_SEQS * model.vocab_size / tp * 4  # 4 bytes per fp32 logit
    return _PROFILE_TOKENS * per_token + logits + _NON_TORCH_BYTES


def kv_cache_blocks(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int = 1,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    activation_bytes: float | None = None,
) -> int:
    """Number of KV-cache blocks a vLLM replica gets, as vLLM sizes its cache.

    Per GPU: ``floor((memory * utilization - weights / tp - activations)
    / (block_size * kv_bytes_per_token * shard))``, where ``shard`` is the fraction of each
    token's KV that GPU holds (1/tp when the KV heads split evenly). Every GPU of the replica
    holds the same block table, so this is also the replica's block count. With even splits it
    equals ``floor((memory * utilization * tp - weights - tp * activations)
    / (block_size * kv_bytes_per_token))``.

    Args:
        model: The model.
        gpu: The GPU (every GPU of the replica is the same kind).
        tp: Tensor-parallel degree (GPUs per replica).
        block_size: Tokens per KV block.
        gpu_memory_utilization: Fraction of device memory vLLM may use (its default is 0.9).
        activation_bytes: Per-GPU activation/workspace bytes to reserve; ``None`` uses
            :func:`estimate_activation_bytes`.

    Returns:
        Number of blocks (>= 1).

    Raises:
        ValueError: On invalid arguments, or when the weights and activations leave no room
            for a single KV block ("does not fit").
    """
    check_tp(model, tp)
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if activation_bytes is None:
        activation_bytes = estimate_activation_bytes(model, tp)
    elif activation_bytes < 0:
        raise ValueError(f"activation_bytes must be >= 0, got {activation_bytes}")

    budget = gpu.memory_bytes * gpu_memory_utilization  # bytes per GPU vLLM may use
    weights = model.weight_bytes / tp  # bytes of this GPU's weight shard
    free = budget - weights - activation_bytes  # bytes per GPU left for KV
    block_bytes = block_size * model.kv_bytes_per_token * kv_shard_fraction(model, tp)
    blocks = math.floor(free / block_bytes)
    if blocks < 1:
        raise ValueError(
            f"{model.name} does not fit on {gpu.name} with tp={tp}: per GPU the weights need "
            f"{weights / GiB:.1f} GiB and activations {activation_bytes / GiB:.1f} GiB, but "
            f"only {budget / GiB:.1f} GiB is usable at gpu_memory_utilization="
            f"{gpu_memory_utilization}, leaving no room for one {block_size}-token KV block; "
            f"use a larger tp or a bigger GPU"
        )
    return blocks
