"""Model presets for disaggregation studies: Llama 3.1 8B/70B and DeepSeek-V2-Lite (MLA, MoE).

KV sizes per token, KV replicated (MLA) or split (GQA) under tensor parallelism, mixture-of-
experts memory from every parameter and compute from the active ones, and the presets build."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cbgym import EngineConfig
from cbgym.engine.cost_model import BatchStats
from cbgym.engine.hardware import (
    GPUS,
    MODELS,
    GiB,
    KiB,
    ModelSpec,
    check_tp,
    kv_bytes_per_token_per_gpu,
    kv_cache_blocks,
    kv_shard_fraction,
)
from cbgym.engine.roofline import PRESETS, RooflineCostModel

DSV2 = MODELS["deepseek-v2-lite"]


def decode(n: int, ctx: int) -> BatchStats:
    """One decode iteration of ``n`` sequences holding ``ctx`` tokens each."""
    return BatchStats(num_seqs=n, prefill_tokens=0, decode_seqs=n, sampled_seqs=n,
                      attn_q_ctx=n * ctx, attn_q_sq=n, kv_tokens=n * (ctx + 1))


def prefill(x: int) -> BatchStats:
    """One fresh prompt of ``x`` tokens (it samples its first token)."""
    return BatchStats(num_seqs=1, prefill_tokens=x, decode_seqs=0, sampled_seqs=1,
                      attn_q_ctx=0, attn_q_sq=x * (x + 1) // 2, kv_tokens=x)


# ---------------------------------------------------------------- KV bytes per token


@pytest.mark.parametrize(("model", "kv_bytes"), [
    ("deepseek-v2-lite", 31_104),  # 27 layers x (512 latent + 64 RoPE) x 2 bytes
    ("llama-3.1-8b", 131_072),  # 2 x 32 x 8 x 128 x 2 = 128 KiB
    ("llama-3.1-70b", 327_680),  # 2 x 80 x 8 x 128 x 2 = 320 KiB
    ("llama-3-8b", 131_072),
])
def test_kv_bytes_per_token(model: str, kv_bytes: int) -> None:
    assert MODELS[model].kv_bytes_per_token == kv_bytes
    # a transfer moves one copy of the whole model's KV, whatever the sharding
    assert MODELS[model].kv_bytes_per_token_total == kv_bytes


def test_deepseek_kv_is_about_30_kib() -> None:
    assert DSV2.kv_bytes_per_token / KiB == pytest.approx(30.375)
    # a GQA model with the same 27 layers and 16 KV heads of 128 would cache 7.1x as much
    assert 2 * 27 * 16 * 128 * 2 / DSV2.kv_bytes_per_token == pytest.approx(7.1, abs=0.05)


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_mla_latent_is_replicated_on_every_rank(tp: int) -> None:
    check_tp(DSV2, tp)  # 16 query heads split; the one latent "KV head" never constrains tp
    assert kv_shard_fraction(DSV2, tp) == 1.0
    assert kv_bytes_per_token_per_gpu(DSV2, tp) == 31_104


@pytest.mark.parametrize(("tp", "per_gpu"), [(1, 327_680), (4, 81_920), (8, 40_960)])
def test_gqa_kv_is_split_across_ranks(tp: int, per_gpu: int) -> None:
    m = MODELS["llama-3.1-70b"]
    check_tp(m, tp)
    assert kv_bytes_per_token_per_gpu(m, tp) == per_gpu
    assert per_gpu * tp == m.kv_bytes_per_token_total  # the shards add up to one copy


def test_llama_31_and_3_share_shapes_and_differ_in_context() -> None:
    new, old = MODELS["llama-3.1-8b"], MODELS["llama-3-8b"]
    assert dataclasses.replace(new, name=old.name, max_position_embeddings=8192) == old
    assert (new.max_position_embeddings, old.max_position_embeddings) == (131_072, 8192)
    assert MODELS["llama-3.1-70b"].max_position_embeddings == 131_072
    assert DSV2.max_position_embeddings == 163_840


# ---------------------------------------------------------------- MoE: memory vs compute


def test_deepseek_param_counts_match_its_config_json() -> None:
    # Counted from deepseek-ai/DeepSeek-V2-Lite config.json, independently of the spec.
    h, heads, nope, rope, v, rank = 2048, 16, 128, 64, 128, 512
    attn = (h * heads * (nope + rope)  # q_proj (q_lora_rank null)
            + h * (rank + rope)  # kv_a_proj_with_mqa
            + rank * heads * (nope + v)  # kv_b_proj
            + heads * v * h)  # o_proj
    dense_mlp = 3 * h * 10944
    expert = 3 * h * 1408
    router = 64 * h
    embed = 102400 * h  # embedding; the untied LM head is the same size
    total = 27 * attn + dense_mlp + 26 * (66 * expert + router) + 2 * embed
    active_blocks = 27 * attn + dense_mlp + 26 * (8 * expert + router)
    assert total == pytest.approx(DSV2.num_params, rel=0.001)  # 15.71B vs the card's 15.7B
    assert DSV2.linear_params == pytest.approx(total - 2 * embed, rel=0.001)
    # the card's "2.4B activated" is 2.45B rounded: blocks + LM head, no embedding lookup
    assert (active_blocks + embed) / 1e9 == pytest.approx(2.45, abs=0.005)
    assert DSV2.active_linear_params == pytest.approx(active_blocks, rel=0.03)
    assert DSV2.is_moe and not MODELS["llama-3.1-8b"].is_moe


def test_moe_kv_capacity_is_left_by_all_weights() -> None:
    a100 = GPUS["a100-80gb"]
    blocks = kv_cache_blocks(DSV2, a100, activation_bytes=0)
    # every expert is resident: 15.7e9 x 2 B of weights, not 2.4e9 x 2 B
    assert blocks == math.floor((0.9 * 79.15 * GiB - 15.7e9 * 2) / (16 * 31_104))
    dense_sized = dataclasses.replace(DSV2, num_active_params=None)
    assert kv_cache_blocks(dense_sized, a100, activation_bytes=0) == blocks
    # doubling tp halves the weights per GPU but not the replicated latent per block
    tp2 = kv_cache_blocks(DSV2, GPUS["a100-80gb"], 2, activation_bytes=0)
    assert tp2 == math.floor((0.9 * 79.15 * GiB - 15.7e9) / (16 * 31_104))


def test_moe_compute_is_priced_from_active_params() -> None:
    moe = RooflineCostModel.from_preset("deepseek-v2-lite/a100-80gb")
    dense = RooflineCostModel(dataclasses.replace(DSV2, num_active_params=None), moe.gpu)
    # a large prefill is compute bound: linear time scales with the parameters a token uses
    big = prefill(4096)
    ratio = moe.breakdown(big)["linear"] / dense.breakdown(big)["linear"]
    assert ratio == pytest.approx(DSV2.active_linear_params / DSV2.linear_params)
    assert 0.13 < ratio < 0.16
    flops = 0.71 * moe.gpu.peak_flops
    assert moe.breakdown(big)["linear"] == pytest.approx(2 * 2.19e9 * 4096 / flops, rel=0.01)
    # a decode step of a full batch: the dense model is compute bound, the MoE reads weights
    step = decode(256, 1000)
    assert moe.iteration_time(step) < 0.75 * dense.iteration_time(step)
    assert moe.breakdown(step)["linear"] == pytest.approx(
        DSV2.linear_params * 2 / (0.75 * moe.gpu.mem_bandwidth))
    # a tiny batch reads the same weights either way (every expert is charged: see roofline)
    assert moe.breakdown(decode(1, 1000))["linear"] == dense.breakdown(decode(1, 1000))["linear"]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_mla_attention_reads_the_whole_latent_per_rank(tp: int) -> None:
    m = RooflineCostModel(DSV2, GPUS["h100-80gb"], tp)
    step = decode(64, 4000)
    assert m.breakdown(step)["attention"] == pytest.approx(
        31_104 * step.kv_tokens / (0.75 * m.gpu.mem_bandwidth))
    # its FLOPs per (query, key) pair: QK^T over 128 + 64 and PV over 128, 16 heads, 27 layers
    assert DSV2.attention_flops_per_pair == 27 * 16 * (2 * 192 + 2 * 128)


def test_swap_moves_the_replicated_latent_over_every_host_link() -> None:
    link = GPUS["h100-80gb"].host_link_bytes_per_s
    base, swap = decode(4, 100), dataclasses.replace(decode(4, 100), swap_bytes=1e9)
    for preset, per_gpu_bytes in (("deepseek-v2-lite/h100-80gb/tp2", 1e9),
                                  ("llama-3.1-70b/h100-80gb/tp4", 0.25e9)):
        m = RooflineCostModel.from_preset(preset)
        assert m.iteration_time(swap) - m.iteration_time(base) == pytest.approx(
            per_gpu_bytes / link)


# ---------------------------------------------------------------- presets build


@pytest.mark.parametrize(("preset", "tp", "kv_bytes", "min_tokens"), [
    ("deepseek-v2-lite/a100-80gb", 1, 31_104, 1_000_000),
    ("llama-3.1-8b/h100-80gb", 1, 131_072, 300_000),
    ("llama-3.1-70b/h100-80gb/tp4", 4, 327_680, 300_000),
    ("llama-3.1-70b/h100-80gb/tp8", 8, 327_680, 1_000_000),
    ("llama-3-8b/h100-80gb", 1, 131_072, 300_000),
])
def test_presets_build(preset: str, tp: int, kv_bytes: int, min_tokens: int) -> None:
    cfg = EngineConfig(preset=preset)
    assert cfg.num_kv_blocks is not None and cfg.num_kv_blocks > 0
    assert cfg.kv_capacity_tokens > min_tokens
    # one whole copy per token (what swap and KV transfers size with), as for older presets
    assert cfg.kv_bytes_per_token == kv_bytes
    assert isinstance(cfg.cost_model, RooflineCostModel) and cfg.cost_model.tp == tp
    assert cfg.max_model_len == MODELS[preset.split("/")[0]].max_position_embeddings


def test_llama_31_70b_needs_tensor_parallelism_and_tp8_holds_more() -> None:
    with pytest.raises(ValueError, match="llama-3.1-70b does not fit on h100-80gb with tp=1"):
        EngineConfig(preset="llama-3.1-70b/h100-80gb")
    tp4 = EngineConfig(preset="llama-3.1-70b/h100-80gb/tp4").num_kv_blocks
    tp8 = EngineConfig(preset="llama-3.1-70b/h100-80gb/tp8").num_kv_blocks
    assert tp4 is not None and tp8 is not None and tp8 > 2 * tp4


def test_new_presets_are_listed_and_price_a_batch() -> None:
    for name in ("deepseek-v2-lite/a100-80gb", "llama-3.1-8b/h100-80gb",
                 "llama-3.1-70b/h100-80gb/tp4", "llama-3.1-70b/h100-80gb/tp8"):
        assert name in PRESETS
    for name in PRESETS:
        t = RooflineCostModel.from_preset(name).iteration_time(decode(8, 512))
        assert 0 < t < 1


# ---------------------------------------------------------------- validation

MLA = dict(attention="mla", kv_lora_rank=512, rope_head_dim=64)
SHAPE = ("m", 15.7e9, 27, 2048, 16, 1, 102400, 10944)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"attention": "mqa"}, r"ModelSpec\.attention must be 'gqa' or 'mla', got 'mqa'"),
    ({**MLA, "kv_lora_rank": None}, r"ModelSpec\.kv_lora_rank must be a positive int"),
    ({**MLA, "kv_lora_rank": 0}, r"ModelSpec\.kv_lora_rank must be a positive int"),
    ({**MLA, "rope_head_dim": True}, r"ModelSpec\.rope_head_dim must be a positive int"),
    ({**MLA, "rope_head_dim": 64.0}, r"ModelSpec\.rope_head_dim must be a positive int"),
    ({"kv_lora_rank": 512}, r"ModelSpec\.kv_lora_rank applies only to attention='mla'"),
    ({"rope_head_dim": 64}, r"ModelSpec\.rope_head_dim applies only to attention='mla'"),
    ({"num_active_params": 16e9}, r"ModelSpec\.num_active_params must be None or"),
    ({"num_active_params": -1.0}, r"ModelSpec\.num_active_params must be None or"),
    ({"num_active_params": float("nan")}, r"ModelSpec\.num_active_params must be None or"),
    ({"num_active_params": "2.4e9"}, r"ModelSpec\.num_active_params must be None or"),
    ({"num_active_params": 1e8}, r"ModelSpec\.num_active_params .*above the LM head"),
])
def test_bad_mla_and_moe_fields_are_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelSpec(*SHAPE, **kwargs)  # type: ignore[arg-type]


def test_mla_needs_one_kv_head_and_moe_room_for_blocks() -> None:
    with pytest.raises(ValueError, match=r"ModelSpec\.num_kv_heads must be 1 for attention"):
        ModelSpec("m", 15.7e9, 27, 2048, 16, 16, 102400, 10944, **MLA)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ModelSpec\.num_params .* must exceed the embedding"):
        ModelSpec("m", 4e8, 27, 2048, 16, 1, 102400, 10944, **MLA)  # type: ignore[arg-type]
    # a well-formed spec of one's own works as a preset model does
    own = ModelSpec(*SHAPE, **MLA, num_active_params=2.4e9)  # type: ignore[arg-type]
    assert own.kv_bytes_per_token == 31_104
    assert RooflineCostModel(own, GPUS["h200"], 2).iteration_time(decode(8, 100)) > 0
