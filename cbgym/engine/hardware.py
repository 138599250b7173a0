"""GPU descriptions, and the KV-cache capacity a model leaves on them.

All quantities are in SI units unless a name says otherwise: bytes, FLOP/s, bytes/s.
``GiB`` (2**30 bytes) appears only where a figure is quoted the way CUDA reports it.

Sources for the constants: NVIDIA A100/H100/H200 datasheets (dense BF16 tensor-core peak,
HBM bandwidth, NVLink and PCIe generation). The model shapes (:class:`ModelSpec`,
:data:`MODELS`, from each model's Hugging Face ``config.json``) live in
:mod:`cbgym.engine.models` and are re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Model shapes live in cbgym.engine.models; re-exported here, where they have always been
from cbgym.engine.models import MODELS, AttentionKind, ModelSpec, _finite_real

__all__ = [
    "GPUS", "MODELS", "AttentionKind", "GiB", "GpuSpec", "KiB", "ModelSpec", "check_tp",
    "estimate_activation_bytes", "kv_bytes_per_token_per_gpu", "kv_cache_blocks",
    "kv_shard_fraction",
]

GiB = 2**30  # bytes
KiB = 2**10  # bytes


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
    (replicated) head, as vLLM does. An MLA model has one (latent) KV head, so every GPU holds
    all of it: the fraction is 1 at any ``tp``.
    """
    return max(model.num_kv_heads // tp, 1) / model.num_kv_heads


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int = 1) -> float:
    """KV bytes per token one GPU of a ``tp``-way replica holds (and its attention reads).

    ``kv_bytes_per_token * kv_shard_fraction``: 1/tp of a GQA model whose KV heads split
    evenly, the whole latent for MLA. What each rank would send over its own link in a
    rank-to-rank KV transfer; :attr:`ModelSpec.kv_bytes_per_token_total` is one whole copy.
    """
    check_tp(model, tp)
    return model.kv_bytes_per_token * kv_shard_fraction(model, tp)


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
    token's KV that GPU holds (1/tp when the KV heads split evenly, 1 for MLA's replicated
    latent) and the weights are all of them (every expert of a mixture of experts, since
    each must be resident whichever a token is routed to). Every GPU of the replica
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
