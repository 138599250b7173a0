"""Cost models: the linear model's formula, the roofline model's shape and its agreement with
published measurements, the table model's fit and CSV validation, and KV-cache sizing."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbgym.engine.cost_model import BatchStats, CostModel, LinearCostModel
from cbgym.engine.hardware import (
    GPUS,
    MODELS,
    GiB,
    GpuSpec,
    KiB,
    ModelSpec,
    estimate_activation_bytes,
    kv_cache_blocks,
)
from cbgym.engine.roofline import PRESETS, RooflineCostModel
from cbgym.engine.table_cost import TableCostModel

FIELDS = [f.name for f in dataclasses.fields(BatchStats)]


def batch(
    prefills: Sequence[tuple[int, int]] = (), decodes: Sequence[int] = (), swap: float = 0
) -> BatchStats:
    """Stats of one iteration: prefill chunks as (new tokens q, cached context c), each finishing
    its prompt (so it samples); decodes as their context lengths."""
    reqs = [(q, c) for q, c in prefills] + [(1, c) for c in decodes]
    return BatchStats(
        num_seqs=len(reqs),
        prefill_tokens=sum(q for q, _ in prefills),
        decode_seqs=len(decodes),
        sampled_seqs=len(reqs),
        attn_q_ctx=sum(q * c for q, c in reqs),
        attn_q_sq=sum(q * (q + 1) / 2 for q, _ in reqs),
        kv_tokens=sum(q + c for q, c in reqs),
        swap_bytes=swap,
    )


def stack(batches: list[BatchStats]) -> BatchStats:
    """The same iterations as one BatchStats of arrays."""
    return BatchStats(**{f: np.array([getattr(b, f) for b in batches], float) for f in FIELDS})


def decode_stretch(n: int, first_ctx: int, steps: int) -> BatchStats:
    """``steps`` decode-only iterations of ``n`` requests whose context starts at first_ctx."""
    ctx = np.arange(first_ctx, first_ctx + steps)
    return BatchStats(
        num_seqs=n,
        prefill_tokens=0,
        decode_seqs=n,
        sampled_seqs=n,
        attn_q_ctx=n * ctx,
        attn_q_sq=n,
        kv_tokens=n * (ctx + 1),
    )


batches = st.builds(
    batch,
    st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), max_size=4),
    st.lists(st.integers(0, 16384), max_size=64),
    st.sampled_from([0.0, 1e6, 3e8]),
)


# ---------------------------------------------------------------- linear model


def test_linear_formula() -> None:
    m = LinearCostModel(
        base_s=0.01, prefill_per_token_s=2e-4, decode_per_seq_s=3e-4, host_link_bytes_per_s=10e9
    )
    s = batch([(100, 0)], [10, 20], swap=5e9)
    assert m.iteration_time(s) == pytest.approx(0.01 + 100 * 2e-4 + 2 * 3e-4 + 0.5)


def test_linear_prefill_base_only_for_prefill_only_iterations() -> None:
    m = LinearCostModel(
        base_s=0.012, prefill_base_s=0.008, prefill_per_token_s=0.0, decode_per_seq_s=0.0
    )
    assert m.iteration_time(batch([(64, 0)])) == pytest.approx(0.008)
    assert m.iteration_time(batch([(64, 0)], [5])) == pytest.approx(0.012)
    assert m.iteration_time(batch([], [5])) == pytest.approx(0.012)
    # without prefill_base_s every iteration pays base_s
    assert LinearCostModel(base_s=0.012).iteration_time(batch([(1, 0)])) == pytest.approx(
        0.012 + 0.00028
    )


@pytest.mark.parametrize("prefill_base_s", [None, 0.008])
@settings(max_examples=25, deadline=None)
@given(bs=st.lists(batches, min_size=1, max_size=8))
def test_linear_arrays_equal_scalars(prefill_base_s: float | None, bs: list[BatchStats]) -> None:
    m = LinearCostModel(prefill_base_s=prefill_base_s)
    scalars = [m.iteration_time(b) for b in bs]
    np.testing.assert_allclose(m.iteration_time(stack(bs)), scalars, rtol=1e-12)


def test_linear_rejects_negative_coefficients() -> None:
    with pytest.raises(ValueError, match="decode_per_seq_s"):
        LinearCostModel(decode_per_seq_s=-1.0)


# ---------------------------------------------------------------- roofline model: shape

A100_7B = RooflineCostModel.from_preset("llama-2-7b/a100-80gb")


def test_roofline_is_a_cost_model() -> None:
    assert isinstance(A100_7B, CostModel)


@settings(max_examples=40, deadline=None)
@given(bs=st.lists(batches, min_size=1, max_size=8), preset=st.sampled_from(PRESETS))
def test_roofline_arrays_equal_scalars(bs: list[BatchStats], preset: str) -> None:
    m = RooflineCostModel.from_preset(preset)
    scalars = [m.iteration_time(b) for b in bs]
    assert all(isinstance(t, float) for t in scalars)
    np.testing.assert_allclose(m.iteration_time(stack(bs)), scalars, rtol=1e-12)


def test_roofline_mixed_scalar_and_array_fields() -> None:
    """A decode stretch: counts are scalars, context sums are arrays."""
    stretch = decode_stretch(8, 100, 50)
    times = A100_7B.iteration_time(stretch)
    assert times.shape == (50,)
    singles = [A100_7B.iteration_time(batch([], [c] * 8)) for c in range(100, 150)]
    np.testing.assert_allclose(times, singles, rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(b=batches)
def test_roofline_breakdown_sums_to_iteration_time(b: BatchStats) -> None:
    m = RooflineCostModel.from_preset("llama-2-70b/h100-80gb/tp4", cpu_per_seq_s=1e-4)
    parts = m.breakdown(b)
    assert set(parts) == {
        "linear",
        "lm_head",
        "attention",
        "elementwise",
        "allreduce",
        "cpu",
        "swap",
    }
    assert sum(parts.values()) == pytest.approx(m.iteration_time(b), rel=1e-12)


def test_roofline_monotone_in_tokens_and_context() -> None:
    prefill = [A100_7B.iteration_time(batch([(q, 0)])) for q in range(1, 8193, 97)]
    assert np.all(np.diff(prefill) > 0)
    decodes = [A100_7B.iteration_time(batch([], [100] * n)) for n in range(1, 257)]
    assert np.all(np.diff(decodes) >= 0)
    context = A100_7B.iteration_time(decode_stretch(32, 0, 20000))
    assert np.all(np.diff(context) >= 0) and context[-1] > context[0]


def test_decode_is_memory_bound_and_large_prefill_compute_bound() -> None:
    m = A100_7B
    dec = batch([], [1000] * 8)
    lin = m.breakdown(dec)["linear"]
    assert lin == pytest.approx(m.model.linear_params * 2 / (0.75 * m.gpu.mem_bandwidth))
    # decode attention reads KV: its time is the memory term
    assert m.breakdown(dec)["attention"] == pytest.approx(
        m.model.kv_bytes_per_token * dec.kv_tokens / (0.75 * m.gpu.mem_bandwidth)
    )
    pre = batch([(4096, 0)])
    lin = m.breakdown(pre)["linear"]
    assert lin == pytest.approx(2 * m.model.linear_params * 4096 / (0.71 * m.gpu.peak_flops))
    # ridge point: 2 P T / (eta_c F) = 2 P / (eta_m BW) at T = eta_c F / (eta_m BW) ~ 145
    ridge = (0.71 * 312e12) / (0.75 * 2.039e12)
    assert 140 < ridge < 150
    weights_only = m.breakdown(batch([], [0]))["linear"]
    assert m.breakdown(batch([], [0] * 140))["linear"] == pytest.approx(weights_only)
    assert m.breakdown(batch([], [0] * 150))["linear"] > weights_only


def test_tensor_parallel_and_faster_gpus_are_faster() -> None:
    step = batch([], [500] * 16)
    tp2 = RooflineCostModel(MODELS["llama-2-70b"], GPUS["a100-80gb"], 2)
    tp4 = RooflineCostModel.from_preset("llama-2-70b/a100-80gb/tp4")
    assert tp4.iteration_time(step) < tp2.iteration_time(step)
    assert tp4.breakdown(step)["allreduce"] > 0 == A100_7B.breakdown(step)["allreduce"]
    times = [
        RooflineCostModel.from_preset(f"llama-2-7b/{g}").iteration_time(step)
        for g in ("a100-80gb", "h100-80gb", "h200")
    ]
    assert times[0] > times[1] > times[2]


def test_swap_is_split_over_the_replicas_host_links() -> None:
    base = batch([], [10])
    with_swap = batch([], [10], swap=50e9)
    tp4 = RooflineCostModel.from_preset("llama-2-70b/h100-80gb/tp4")
    extra = tp4.iteration_time(with_swap) - tp4.iteration_time(base)
    assert extra == pytest.approx(50e9 / (4 * 50e9))


def test_presets_cover_the_required_combinations() -> None:
    for model in ("llama-2-7b", "llama-2-13b", "llama-3-8b"):
        for gpu in ("a100-80gb", "h100-80gb", "h200"):
            assert f"{model}/{gpu}" in PRESETS
    for gpu in ("a100-80gb", "h100-80gb", "h200"):
        assert f"llama-2-70b/{gpu}/tp4" in PRESETS
    for name in PRESETS:
        m = RooflineCostModel.from_preset(name)
        assert m.iteration_time(batch([(512, 0)], [100] * 8)) > 0


def test_from_preset_overrides_and_case() -> None:
    m = RooflineCostModel.from_preset("Llama-2-7B/A100-80GB", cpu_overhead_s=0.0)
    assert m.cpu_overhead_s == 0.0 and m.tp == 1 and m.model is MODELS["llama-2-7b"]
    assert RooflineCostModel.from_preset("llama-2-70b/h200/tp8").tp == 8


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("llama-9b/a100-80gb", r"unknown model 'llama-9b'.*llama-2-7b"),
        ("llama-2-7b/v100", r"unknown gpu 'v100'.*a100-80gb"),
        ("llama-2-70b/a100-80gb/tpx", r"bad tensor-parallel part 'tpx'"),
        ("llama-2-70b/a100-80gb/4", r"bad tensor-parallel part '4'"),
        ("llama-2-7b", r"must look like"),
        ("llama-2-70b/a100-80gb/tp3", r"tp=3 must divide num_heads"),
    ],
)
def test_from_preset_errors_name_the_bad_part(name: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RooflineCostModel.from_preset(name)


def test_roofline_validates_and_is_frozen() -> None:
    with pytest.raises(ValueError, match="eta_memory"):
        RooflineCostModel(MODELS["llama-2-7b"], GPUS["h200"], eta_memory=1.5)
    with pytest.raises(ValueError, match="cpu_overhead_s"):
        RooflineCostModel(MODELS["llama-2-7b"], GPUS["h200"], cpu_overhead_s=-1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        A100_7B.tp = 2  # type: ignore[misc]


# ------------------------------------------------- roofline model vs published measurements
#
# Every expected value below is a published measurement; the comment next to it names the
# source and the table or file. Tolerances are generous (the model is a roofline, the
# measurements come from different engines), but each is tight enough that a wrong efficiency,
# unit or sharding factor fails it.

VIDUR_TOL = 0.10  # per-operator GPU kernel times: the model was calibrated on these
E2E_TOL = 0.25  # end-to-end engine measurements (different engines, CPU overheads)


def vidur_check(preset: str, tokens: int, part: str, expected_ms: float) -> None:
    """GPU time of one component for a prefill of ``tokens`` tokens."""
    m = RooflineCostModel.from_preset(preset)
    got = 1e3 * m.breakdown(batch([(tokens, 0)]))[part]
    assert got == pytest.approx(expected_ms, rel=VIDUR_TOL), f"{preset} {part} {tokens}"


# Vidur operator profiles (github.com/microsoft/vidur), Llama-2-7B, TP1, mean ms per layer:
# data/profiling/compute/{a100,h100}/meta-llama/Llama-2-7b-hf/mlp.csv (commits bee57da, e26eb8f).
# linear = attn_pre_proj + attn_post_proj + mlp_up_proj + mlp_down_proj;
# elementwise = input_layernorm + post_attention_layernorm + attn_rope + mlp_act + 2 * add.
@pytest.mark.parametrize(
    ("preset", "tokens", "part", "expected_ms"),
    [
        # A100, 1 token: (0.0657 + 0.0249 + 0.1157 + 0.0602) ms x 32 layers
        ("llama-2-7b/a100-80gb", 1, "linear", 32 * 0.2664),
        # A100, 4096 tokens: (1.857 + 0.600 + 3.279 + 1.560) ms x 32
        ("llama-2-7b/a100-80gb", 4096, "linear", 32 * 7.296),
        # A100, 1 token: (0.005 + 0.005 + 0.0055 + 0.007 + 2 * 0.002) ms x 32
        ("llama-2-7b/a100-80gb", 1, "elementwise", 32 * 0.0265),
        # A100, 4096 tokens: (0.1022 + 0.1021 + 0.147 + 0.2616 + 2 * 0.055) ms x 32
        ("llama-2-7b/a100-80gb", 4096, "elementwise", 32 * 0.7229),
        # H100, 1 token: (0.0376 + 0.0161 + 0.0644 + 0.0383) ms x 32
        ("llama-2-7b/h100-80gb", 1, "linear", 32 * 0.1564),
        # H100, 4096 tokens: (0.5846 + 0.1923 + 0.9862 + 0.4371) ms x 32
        ("llama-2-7b/h100-80gb", 4096, "linear", 32 * 2.200),
        # H100, 4096 tokens: (0.0665 + 0.0668 + 0.0835 + 0.1386 + 2 * 0.0312) ms x 32
        ("llama-2-7b/h100-80gb", 4096, "elementwise", 32 * 0.4178),
    ],
)
def test_operators_match_vidur_profiles(
    preset: str, tokens: int, part: str, expected_ms: float
) -> None:
    vidur_check(preset, tokens, part, expected_ms)


def test_decode_batch1_before_attention_and_lm_head() -> None:
    # Reference engine notes (Vidur A100 Llama-2-7B calibration): ~9.3 ms.
    parts = A100_7B.breakdown(batch([], [100]))
    assert 1e3 * (parts["linear"] + parts["elementwise"]) == pytest.approx(9.3, rel=0.05)


# gpt-fast README, "Benchmarks" and "Tensor Parallelism" tables (github.com/pytorch-labs/
# gpt-fast): 8xA100-80GB (power-limited to 330 W), batch size 1, bf16 "Base", 5-token prompt;
# tokens/s -> ms per token = 1000 / (tokens/s).
@pytest.mark.parametrize(
    ("model", "tp", "tokens_per_s"),
    [
        ("llama-2-7b", 1, 104.9),
        ("llama-2-7b", 2, 168.84),
        ("llama-2-7b", 4, 254.02),
        ("llama-2-7b", 8, 328.43),
        ("llama-2-70b", 2, 21.32),
        ("llama-2-70b", 4, 38.01),
        ("llama-2-70b", 8, 62.50),
    ],
)
def test_batch1_decode_matches_gpt_fast_a100(model: str, tp: int, tokens_per_s: float) -> None:
    m = RooflineCostModel(MODELS[model], GPUS["a100-80gb"], tp)
    got = m.iteration_time(batch([], [100]))  # ~100 tokens of context mid-generation
    assert got == pytest.approx(1 / tokens_per_s, rel=E2E_TOL)


# TensorRT-LLM v0.5 docs/source/performance.md, "Low Latency", table "A100 GPUs (FP16)":
# batch 1, 1st-token latency for a 2048-token input (github.com/NVIDIA/TensorRT-LLM).
@pytest.mark.parametrize(
    ("preset", "expected_ms"),
    [
        ("llama-2-7b/a100-80gb", 133.0),  # "LLaMA 7B | 1 | 1 | 2048 | 133"
        ("llama-2-70b/a100-80gb/tp4", 377.0),  # "LLaMA 70B | 1 | 4 | 2048 | 377"
    ],
)
def test_prefill_2048_matches_tensorrt_llm_a100(preset: str, expected_ms: float) -> None:
    m = RooflineCostModel.from_preset(preset)
    assert 1e3 * m.iteration_time(batch([(2048, 0)])) == pytest.approx(expected_ms, rel=E2E_TOL)


# vLLM performance benchmark, buildkite.com/vllm/performance-benchmark/builds/9515, "Latency
# tests" on H200: input 32 tokens, output 128 tokens, batch size 8, mean end-to-end latency.
@pytest.mark.parametrize(
    ("preset", "expected_ms"),
    [
        ("llama-3-8b/h200", 833.421),  # latency_llama8B_tp1 (Llama-3.1-8B: same shapes)
        ("llama-3-70b/h200/tp4", 2077.53),  # latency_llama70B_tp4
    ],
)
def test_batch8_generation_matches_vllm_h200(preset: str, expected_ms: float) -> None:
    m = RooflineCostModel.from_preset(preset)
    prefill = m.iteration_time(batch([(32, 0)] * 8))  # samples token 1 of 128
    decodes = m.iteration_time(decode_stretch(8, 32, 127))  # tokens 2..128, one array call
    assert 1e3 * (prefill + decodes.sum()) == pytest.approx(expected_ms, rel=E2E_TOL)


def test_single_stream_matches_vllm_a100_40gb() -> None:
    # johnmusgrave.com/p/vllm-throughput-latency-sweep-on: vLLM 0.23, Llama-3.1-8B bf16 on one
    # A100 40GB, 1024-token input, concurrency 1: "about 75 tokens/sec".
    m = RooflineCostModel(MODELS["llama-3-8b"], GPUS["a100-40gb"])
    got = m.iteration_time(batch([], [1024 + 64]))  # mid-way through the 128 output tokens
    assert got == pytest.approx(1 / 75, rel=E2E_TOL)


# ---------------------------------------------------------------- table model


TRUE = {
    "intercept_s": 0.004,
    "prefill_token_s": 1.5e-4,
    "decode_seq_s": 3e-4,
    "kv_token_s": 2e-8,
    "attn_q_sq_s": 1e-9,
}


def profile_frame(n: int = 60, quadratic: bool = False, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "prefill_tokens": rng.integers(0, 4096, n),
            "decode_seqs": rng.integers(0, 256, n),
            "kv_tokens": rng.integers(0, 200_000, n),
            "gpu": "a100",  # extra columns are ignored
        }
    )
    q = df.prefill_tokens.to_numpy(float)
    t = (
        TRUE["intercept_s"]
        + TRUE["prefill_token_s"] * q
        + TRUE["decode_seq_s"] * df.decode_seqs
        + TRUE["kv_token_s"] * df.kv_tokens
    )
    if quadratic:
        t = t + TRUE["attn_q_sq_s"] * q * (q + 1) / 2
    df["time_s"] = t
    return df


@pytest.mark.parametrize("quadratic", [False, True])
def test_table_round_trip_through_csv(tmp_path, quadratic: bool) -> None:
    path = tmp_path / "profile.csv"
    profile_frame(quadratic=quadratic).to_csv(path, index=False)
    m = TableCostModel.from_csv(path, quadratic=quadratic)
    for name, value in TRUE.items():
        expected = value if (quadratic or name != "attn_q_sq_s") else 0.0
        assert getattr(m, name) == pytest.approx(expected, rel=1e-6, abs=1e-15), name
    assert m.rmse_s < 1e-9 and m.source == str(path)
    s = batch([(300, 0)], [10, 20])
    expected = (
        0.004
        + 1.5e-4 * 300
        + 3e-4 * 2
        + 2e-8 * s.kv_tokens
        + (1e-9 * 300 * 301 / 2 if quadratic else 0)
    )
    assert m.iteration_time(s) == pytest.approx(expected, rel=1e-6)
    frame = TableCostModel.from_dataframe(profile_frame(quadratic=quadratic), quadratic=quadratic)
    assert frame.prefill_token_s == pytest.approx(m.prefill_token_s, rel=1e-9)


@settings(max_examples=20, deadline=None)
@given(bs=st.lists(batches, min_size=1, max_size=8))
def test_table_arrays_equal_scalars(bs: list[BatchStats]) -> None:
    m = TableCostModel(0.004, 1.5e-4, 3e-4, 2e-8, 1e-9)
    np.testing.assert_allclose(
        m.iteration_time(stack(bs)), [m.iteration_time(b) for b in bs], rtol=1e-12
    )


def test_table_fit_is_nonnegative_by_default() -> None:
    df = profile_frame()
    df["time_s"] = 0.02 - 1e-6 * df.decode_seqs + 1e-4 * df.prefill_tokens  # decodes "save" time
    m = TableCostModel.from_dataframe(df)
    assert min(m.intercept_s, m.prefill_token_s, m.decode_seq_s, m.kv_token_s) >= 0
    free = TableCostModel.from_dataframe(df, nonnegative=False)
    assert free.decode_seq_s == pytest.approx(-1e-6, rel=1e-6)


def write(tmp_path, text: str) -> str:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "prefill_tokens,decode_seqs,time_s\n1,2,0.1\n",
            r"bad\.csv: missing required column.*"
            r"'kv_tokens'",
        ),
        (
            "prefill_tokens,decode_seqs,kv_tokens,time_s\n1,2,3,0.1\n1,x,3,0.1\n",
            r"bad\.csv:3: column 'decode_seqs': 'x' is not a number",
        ),
        (
            "prefill_tokens,decode_seqs,kv_tokens,time_s\n1,2,3,0.1\n-1,2,3,0.1\n",
            r"bad\.csv:3: column 'prefill_tokens': -1\.0 must be >= 0",
        ),
        (
            "prefill_tokens,decode_seqs,kv_tokens,time_s\n1,2,3,0\n",
            r"bad\.csv:2: column 'time_s': 0\.0 must be > 0",
        ),
        (
            "prefill_tokens,decode_seqs,kv_tokens,time_s\n1,2,3,nan\n",
            r"bad\.csv:2: column 'time_s': 'nan' is not finite",
        ),
        (
            "prefill_tokens,decode_seqs,kv_tokens,time_s\n1,2,3\n",
            r"bad\.csv:2: column 'time_s': '' is not a number",
        ),
        (
            "prefill_tokens,decode_seqs,kv_tokens,time_s\n1,2,3,0.1\n2,2,3,0.1\n",
            r"2 data row\(s\) cannot fit 4 coefficients",
        ),
        ("", r"missing required column"),
    ],
)
def test_table_csv_errors_locate_the_problem(tmp_path, text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TableCostModel.from_csv(write(tmp_path, text))


def test_table_dataframe_errors_name_the_row() -> None:
    df = profile_frame(n=6)
    df["kv_tokens"] = df["kv_tokens"].astype(object)
    df.loc[4, "kv_tokens"] = "lots"
    with pytest.raises(ValueError, match=r"<dataframe> row 4: column 'kv_tokens': 'lots'"):
        TableCostModel.from_dataframe(df)


# ---------------------------------------------------------------- hardware and KV sizing


@pytest.mark.parametrize(
    ("model", "kib"),
    [("llama-2-7b", 512), ("llama-3-8b", 128), ("llama-2-13b", 800), ("llama-2-70b", 320)],
)
def test_kv_bytes_per_token_match_reference(model: str, kib: int) -> None:
    assert MODELS[model].kv_bytes_per_token == kib * KiB


def test_linear_params_are_consistent_with_param_counts() -> None:
    for m in MODELS.values():
        other = m.num_params - m.linear_params - 2 * m.lm_head_params  # norms, rounding
        assert abs(other) < 0.005 * m.num_params, m.name


def test_kv_blocks_llama2_7b_a100() -> None:
    # budget 0.9 * 79.15 GiB = 76.49e9 B; weights 6.74e9 * 2 B = 13.48e9 B;
    # one block = 16 tokens * 512 KiB = 8 MiB. No activations: floor(63.01e9 / 8.39e6) = 7511.
    m, g = MODELS["llama-2-7b"], GPUS["a100-80gb"]
    exact = math.floor((0.9 * 79.15 * GiB - 6.74e9 * 2) / (16 * 512 * KiB))
    assert kv_cache_blocks(m, g, activation_bytes=0) == exact == 7511
    # the default activation estimate reserves ~0.74 GB -> 7423 blocks (~116k tokens)
    assert estimate_activation_bytes(m) == pytest.approx(0.74e9, rel=0.01)
    assert 7000 <= kv_cache_blocks(m, g) <= 7600


def test_kv_blocks_tensor_parallel_and_replicated_kv() -> None:
    m, g = MODELS["llama-2-70b"], GPUS["a100-80gb"]
    tp4 = kv_cache_blocks(m, g, 4, activation_bytes=0)
    # per GPU: (0.9 * 79.15 GiB - 137.96e9 / 4) / (16 * 320 KiB / 4)
    assert tp4 == math.floor((0.9 * 79.15 * GiB - 68.98e9 * 2 / 4) / (16 * 320 * KiB / 4))
    # tp=16 > 8 KV heads: KV is replicated, each GPU keeps one head of 8
    tp16_block = 16 * 320 * KiB / 8
    tp16 = kv_cache_blocks(m, g, 16, activation_bytes=0)
    assert tp16 == math.floor((0.9 * 79.15 * GiB - 68.98e9 * 2 / 16) / tp16_block)


def test_kv_blocks_errors() -> None:
    a100 = GPUS["a100-80gb"]
    with pytest.raises(ValueError, match="llama-2-70b does not fit on a100-80gb with tp=1"):
        kv_cache_blocks(MODELS["llama-2-70b"], a100, 1)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_cache_blocks(MODELS["llama-2-7b"], a100, gpu_memory_utilization=1.2)
    with pytest.raises(ValueError, match="tp=3 must divide num_heads"):
        kv_cache_blocks(MODELS["llama-2-7b"], a100, 3)
    with pytest.raises(ValueError, match="activation_bytes"):
        kv_cache_blocks(MODELS["llama-2-7b"], a100, activation_bytes=-1)


def test_specs_validate_with_parameter_names() -> None:
    with pytest.raises(ValueError, match="num_layers"):
        ModelSpec("m", 1e9, 0, 4096, 32, 32, 32000, 11008)
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelSpec("m", 1e9, 32, 4096, 32, 5, 32000, 11008)
    with pytest.raises(ValueError, match="peak_flops"):
        GpuSpec("g", -1.0, 1e12, 1e10, 1e11, 1e10)
    with pytest.raises(ValueError, match="host_link_bytes_per_s"):
        GpuSpec("g", 1e12, 1e12, 1e10, 1e11, 0.0)
