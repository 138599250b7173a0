"""Model descriptions: the shapes KV-cache sizing and the roofline cost model read.

Sources: each model's Hugging Face ``config.json`` (layers, hidden size, heads, KV heads,
vocabulary, MLP width, context length; for DeepSeek-V2-Lite also the MLA ranks and the experts)
and its model card (parameter counts). :mod:`cbgym.engine.hardware` re-exports everything here.

Two kinds of attention (``ModelSpec.attention``):

- ``"gqa"``, grouped-query attention (multi-head and multi-query as special cases): each token
  caches K and V for every KV head of every layer, ``2 * L * H_kv * d`` elements. Tensor
  parallelism splits the KV heads across GPUs.
- ``"mla"``, multi-head latent attention (DeepSeek-V2/V3): each token caches, per layer, one
  compressed latent of ``kv_lora_rank`` elements plus one RoPE key of ``rope_head_dim``
  elements that all query heads share, ``L * (kv_lora_rank + rope_head_dim)`` elements. vLLM
  caches it as a single KV head, so every tensor-parallel GPU holds the whole latent
  (replicated, not split): such a spec has ``num_kv_heads=1``.

Mixture of experts (``num_active_params`` set): ``num_params`` counts every expert, because every
expert's weights sit in GPU memory (and so bound the KV capacity left); ``num_active_params``
counts what one token passes through, which is what its FLOPs are priced from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Literal

AttentionKind = Literal["gqa", "mla"]
ATTENTION_KINDS: tuple[str, ...] = ("gqa", "mla")


def _finite_real(value: object) -> bool:
    """A finite real number; bool and str are not (math.isfinite would take True or raise)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only transformer (gated MLP; grouped-query or latent attention).

    Args:
        name: Short identifier, e.g. ``"llama-2-7b"``.
        num_params: Total parameter count, embeddings, LM head and every expert included.
        num_layers: Transformer blocks.
        hidden_size: Residual-stream width.
        num_heads: Query heads per layer.
        num_kv_heads: Key/value heads per layer (``< num_heads`` for grouped-query attention;
            1 for MLA, whose latent all heads share).
        vocab_size: Vocabulary size (rows of the embedding and of the LM head).
        intermediate_size: Width of the dense gated MLP (each of gate, up and down
            projections). For a mixture of experts, the dense layers' width (``config.json``
            ``intermediate_size``); it only sizes activation memory and elementwise traffic.
        head_dim: Width of one attention head. For MLA, the non-RoPE query/key width
            (``qk_nope_head_dim``) and the value width (``v_head_dim``), equal in DeepSeek-V2.
        dtype_bytes: Bytes per weight and per KV element (2 for bf16/fp16).
        max_position_embeddings: Context length from the model's ``config.json``; vLLM's
            default ``max_model_len``. ``None`` when unknown (no default cap).
        attention: ``"gqa"`` (default) or ``"mla"`` (see the module docstring).
        kv_lora_rank: MLA only (required there): width of the cached KV latent.
        rope_head_dim: MLA only (required there): width of the cached, shared RoPE key
            (``qk_rope_head_dim``).
        num_active_params: Mixture of experts only: parameters one token passes through, as
            published (LM head included, embedding lookup not; see ``active_linear_params``).
            ``None``: a dense model, every parameter is active.
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
    attention: AttentionKind = "gqa"
    kv_lora_rank: int | None = None
    rope_head_dim: int | None = None
    num_active_params: float | None = None

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
            if not _positive_int(value):
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
        self._check_attention()
        self._check_experts()

    def _check_attention(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"ModelSpec.attention must be 'gqa' or 'mla', got {self.attention!r}"
            )
        for field_name in ("kv_lora_rank", "rope_head_dim"):
            value = getattr(self, field_name)
            if self.attention == "gqa" and value is not None:
                raise ValueError(
                    f"ModelSpec.{field_name} applies only to attention='mla'; "
                    f"{self.name} has attention='gqa' and {field_name}={value!r}"
                )
            if self.attention == "mla" and not _positive_int(value):
                raise ValueError(
                    f"ModelSpec.{field_name} must be a positive int for attention='mla', "
                    f"got {value!r}"
                )
        if self.attention == "mla" and self.num_kv_heads != 1:
            # a config.json's num_key_value_heads (16 for DeepSeek-V2-Lite) counts the heads
            # the latent decompresses into, not what is cached: one latent serves all heads
            raise ValueError(
                f"ModelSpec.num_kv_heads must be 1 for attention='mla' (one cached latent, "
                f"shared by all heads and replicated on every GPU), got {self.num_kv_heads}"
            )

    def _check_experts(self) -> None:
        embed = self.lm_head_params  # the embedding has the LM head's shape
        if not self._dense_gqa and self.num_params <= 2 * embed:
            raise ValueError(
                f"ModelSpec.num_params ({self.num_params!r}) must exceed the embedding and LM "
                f"head ({2 * embed:,} parameters) for {self.name}"
            )
        active = self.num_active_params
        if active is None:
            return
        if not _finite_real(active) or not embed < active <= self.num_params - embed:
            raise ValueError(
                f"ModelSpec.num_active_params must be None or a finite number above the LM "
                f"head ({embed:,} parameters) and at most num_params minus the embedding "
                f"({self.num_params - embed:,.0f}), got {active!r}"
            )

    @property
    def _dense_gqa(self) -> bool:
        """Llama-shaped: the per-token matmuls follow from the shape fields alone."""
        return self.attention == "gqa" and self.num_active_params is None

    @property
    def is_moe(self) -> bool:
        """A mixture of experts (``num_active_params`` given)."""
        return self.num_active_params is not None

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes cached per token over all layers: one copy of the whole model's KV.

        GQA: ``2 * L * H_kv * d * bytes`` (K and V). MLA: ``L * (kv_lora_rank + rope_head_dim)
        * bytes``. Under tensor parallelism one GPU holds ``kv_shard_fraction`` of it
        (:func:`cbgym.engine.hardware.kv_bytes_per_token_per_gpu`): 1/tp of a GQA model whose
        KV heads split evenly, all of it for MLA.
        """
        if self.attention == "mla":
            assert self.kv_lora_rank is not None and self.rope_head_dim is not None
            return self.num_layers * (self.kv_lora_rank + self.rope_head_dim) * self.dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token_total(self) -> int:
        """KV bytes per token a transfer of a request's cache must move (prefill -> decode).

        One copy of every distinct KV element: equal to :attr:`kv_bytes_per_token`, named for
        link models. For GQA split across tensor-parallel ranks it is the sum of the ranks'
        shards; for MLA (and GQA with more ranks than KV heads) every rank holds a copy, but
        one copy is all the receiver needs, so replicas are not counted. A link model that
        prices each rank sending its own holding over its own NIC in parallel wants
        :func:`cbgym.engine.hardware.kv_bytes_per_token_per_gpu` instead.
        """
        return self.kv_bytes_per_token

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (embeddings, LM head and every expert included)."""
        return self.num_params * self.dtype_bytes

    @property
    def linear_params(self) -> int:
        """Parameters of the matmuls in the transformer blocks: the weights an iteration reads.

        Dense GQA: Q, K, V and O projections plus the three MLP projections, summed over
        layers. Excludes the embedding (a lookup, no FLOPs) and the LM head (run only for
        sampled rows). MLA or mixture of experts (latent projections and experts have shapes
        this spec does not carry): ``num_params`` less the embedding and the LM head
        (untied, as in every model here), so every expert is counted.
        """
        if not self._dense_gqa:
            return round(self.num_params) - 2 * self.lm_head_params
        q_width = self.num_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        attn = self.hidden_size * (2 * q_width + 2 * kv_width)  # q, o and k, v projections
        mlp = 3 * self.hidden_size * self.intermediate_size  # gate, up, down
        return self.num_layers * (attn + mlp)

    @property
    def active_linear_params(self) -> int:
        """Block matmul parameters one token passes through: what its FLOPs are priced from.

        Dense: :attr:`linear_params`. Mixture of experts: ``num_active_params`` less the LM
        head. The published active count includes the LM head but not the embedding lookup:
        counted from DeepSeek-V2-Lite's ``config.json`` (MLA 13.76M per layer, dense layer
        67.2M, per MoE layer 6 routed + 2 shared experts of 8.65M and a 0.13M router), the
        blocks hold 2.24B active parameters, 2.45B with the LM head (the card's "2.4B") and
        2.66B with the embedding too. The card's rounding leaves this 2% low.
        """
        if self.num_active_params is None:
            return self.linear_params
        return round(self.num_active_params) - self.lm_head_params

    @property
    def lm_head_params(self) -> int:
        """Parameters of the LM head (hidden -> vocabulary logits)."""
        return self.hidden_size * self.vocab_size

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all heads and layers: QK^T and PV, 2 per MAC.

        GQA: ``4 * L * n_q * d``. MLA: priced in the form vLLM runs prefill in (keys and values
        decompressed from the latent; QK^T over ``head_dim + rope_head_dim``, PV over
        ``head_dim``). Decode runs the absorbed form (QK^T over ``kv_lora_rank +
        rope_head_dim``, PV over ``kv_lora_rank``: 3.4x the FLOPs per pair for DeepSeek-V2)
        but is bound by reading the latent either way (~30 FLOP per byte read, against a
        ridge of 100-200 on A100/H100/H200), so the KV-read term prices it.
        """
        if self.attention == "mla":
            assert self.rope_head_dim is not None
            per_head = 2 * (self.head_dim + self.rope_head_dim) + 2 * self.head_dim
            return self.num_layers * self.num_heads * per_head
        return 4 * self.num_layers * self.num_heads * self.head_dim


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
# meta-llama/Llama-3.1-{8B,70B}: 131072, rope_scaling "llama3" from 8192, which vLLM does not
# multiply; mistralai/Mistral-7B-v0.1: 32768; its 4096-token sliding window bounds attention,
# not length). Llama 3.1 has Llama 3's shapes, so llama-3-8b (Meta-Llama-3-8B) is
# llama-3.1-8b with the shorter context.
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
        # 8,030,261,248 parameters; KV per token 128 KiB, as llama-3-8b
        _llama("llama-3.1-8b", 8.03e9, 32, 4096, 32, 8, 128256, 14336, 131072),
        # 70,553,706,496 parameters; KV per token 320 KiB, as llama-3-70b
        _llama("llama-3.1-70b", 70.55e9, 80, 8192, 64, 8, 128256, 28672, 131072),
        # deepseek-ai/DeepSeek-V2-Lite config.json: 27 layers, hidden 2048, 16 heads,
        # kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim = v_head_dim = 128,
        # q_lora_rank null, vocab 102400, intermediate_size 10944 (first_k_dense_replace = 1
        # dense layer), 26 MoE layers of 64 routed experts (6 per token) + 2 shared, each of
        # moe_intermediate_size 1408; tie_word_embeddings false; max_position_embeddings
        # 163840 (YaRN, factor 40 over 4096). Model card: 15.7B parameters, 2.4B activated.
        # KV per token: 27 * (512 + 64) * 2 = 31,104 B (~30.4 KiB), on every TP rank.
        ModelSpec(
            "deepseek-v2-lite", 15.7e9, 27, 2048, 16, 1, 102400, 10944,
            max_position_embeddings=163840, attention="mla", kv_lora_rank=512,
            rope_head_dim=64, num_active_params=2.4e9,
        ),
    )
}
