"""Bad inputs fail early with a ValueError naming the parameter (or file, line and field).

Each case here used to be accepted silently, wrapped into a wrong value, or fail later with an
error that named nothing (a TypeError deep in the preset derivation, an int64 cast of 1e30).
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cbgym import EngineConfig, LinearCostModel
from cbgym.engine.hardware import GPUS, MODELS, GpuSpec, ModelSpec
from cbgym.engine.roofline import RooflineCostModel
from cbgym.engine.table_cost import TableCostModel
from cbgym.workload import TraceFormatError, load_trace_file
from cbgym.workload.trace import Trace

LINEAR = LinearCostModel()

# ------------------------------------------------------------------ EngineConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # non-integral or non-int counts: 2.5 running requests has no meaning
        ({"max_num_seqs": 2.5}, r"max_num_seqs=2\.5: expected an integer"),
        ({"max_num_batched_tokens": 2048.0}, r"max_num_batched_tokens=2048\.0: expected"),
        ({"num_kv_blocks": 100.5}, r"num_kv_blocks=100\.5: expected None or an integer"),
        ({"num_kv_blocks": "100"}, r"num_kv_blocks='100': expected None or an integer"),
        ({"max_model_len": 4096.0}, r"max_model_len=4096\.0: expected None or an integer"),
        ({"kv_bytes_per_token": "512"}, r"kv_bytes_per_token='512'"),
        ({"kv_bytes_per_token": 0}, r"kv_bytes_per_token=0: expected None or an integer >= 1"),
        # bool is an int subclass, but True is not a count
        ({"max_num_seqs": True}, r"max_num_seqs=True: expected an integer"),
        ({"max_model_len": np.bool_(True)}, r"max_model_len=.*True.*expected None or an integer"),
        # "False" is a truthy string: accepting it would turn chunking *on*
        ({"chunked_prefill": "False"}, r"chunked_prefill='False': expected a bool"),
        ({"chunked_prefill": 0}, r"chunked_prefill=0: expected a bool"),
        ({"gpu_memory_utilization": math.nan}, r"gpu_memory_utilization=nan: expected a finite"),
        ({"gpu_memory_utilization": "0.9"}, r"gpu_memory_utilization='0\.9'"),
        ({"swap_space_gib": math.inf}, r"swap_space_gib=inf: expected a finite real number"),
        ({"swap_space_gib": -1.0}, r"swap_space_gib=-1\.0: expected >= 0"),
        ({"swap_space_gib": True}, r"swap_space_gib=True"),
        ({"preset": 7}, r"preset=7: expected None, 'cbsjf-paper' or a 'model/gpu' string"),
    ],
)
def test_engine_config_rejects_wrong_types(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{"preset": None, "cost_model": LINEAR, "num_kv_blocks": 100, **kwargs})


@pytest.mark.parametrize("preset", ["llama-2-7b/a100-80gb", "cbsjf-paper"])
def test_types_are_checked_before_the_preset_uses_them(preset: str) -> None:
    # a str block size used to reach kv_cache_blocks (or -(-n // "16")) as an unnamed TypeError
    with pytest.raises(ValueError, match=r"EngineConfig\.block_size='16'"):
        EngineConfig(preset=preset, block_size="16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"EngineConfig\.gpu_memory_utilization=None"):
        EngineConfig(preset=preset, gpu_memory_utilization=None)  # type: ignore[arg-type]


def test_numpy_scalars_are_accepted_and_normalised() -> None:
    # counts often come out of numpy arithmetic; downstream code expects plain Python types
    cfg = EngineConfig(
        preset=None, cost_model=LINEAR, num_kv_blocks=np.int64(100), max_num_seqs=np.int32(8),
        max_model_len=np.uint16(512), chunked_prefill=np.bool_(False),
        gpu_memory_utilization=np.float32(0.5),
    )
    assert (cfg.num_kv_blocks, cfg.max_num_seqs, cfg.max_model_len) == (100, 8, 512)
    for value in (cfg.num_kv_blocks, cfg.max_num_seqs, cfg.max_model_len, cfg.block_size):
        assert type(value) is int
    assert cfg.chunked_prefill is False and type(cfg.gpu_memory_utilization) is float


@pytest.mark.parametrize(
    ("preset", "context"),
    [
        ("llama-2-7b/a100-80gb", 4096),
        ("llama-2-13b/h100-80gb", 4096),
        ("llama-2-70b/h200/tp4", 4096),
        ("llama-3-8b/a100-80gb", 8192),
        ("llama-3-70b/h200/tp4", 8192),
        ("mistral-7b/h200", 32768),
    ],
)
def test_hardware_presets_default_max_model_len_to_the_context(preset: str, context: int) -> None:
    # vLLM serves at most max_position_embeddings tokens unless told otherwise
    assert EngineConfig(preset=preset).max_model_len == context
    assert MODELS[preset.split("/")[0]].max_position_embeddings == context


def test_max_model_len_default_leaves_other_modes_and_explicit_values_alone() -> None:
    # the study's mode serves every request, however long; preset=None has no model
    assert EngineConfig(preset="cbsjf-paper").max_model_len is None
    assert EngineConfig(preset=None, cost_model=LINEAR, num_kv_blocks=10).max_model_len is None
    # vLLM allows a longer max_model_len with VLLM_ALLOW_LONG_MAX_MODEL_LEN: kept as given
    assert EngineConfig(max_model_len=100_000).max_model_len == 100_000
    assert EngineConfig(max_model_len=1024).max_model_len == 1024


def test_model_spec_context_length_is_validated() -> None:
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ModelSpec(
            "m", 1e9, 32, 4096, 32, 32, 32000, 11008,
            max_position_embeddings=4096.0,  # type: ignore[arg-type]
        )
    assert ModelSpec("m", 1e9, 32, 4096, 32, 32, 32000, 11008).max_position_embeddings is None


def test_specs_reject_non_numbers() -> None:
    with pytest.raises(ValueError, match=r"GpuSpec\.peak_flops must be a finite number > 0"):
        GpuSpec("g", "1e12", 1e12, 1e10, 1e11, 1e10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ModelSpec\.num_params must be a finite number"):
        ModelSpec("m", True, 32, 4096, 32, 32, 32000, 11008)


# ------------------------------------------------------------------ cost models

BAD_COSTS = [
    (math.nan, "finite"), (math.inf, "finite"), (-1e-3, ">= 0"), (True, "True"), ("0.01", "0.01"),
]


@pytest.mark.parametrize("name", ["base_s", "prefill_per_token_s", "decode_per_seq_s",
                                  "prefill_base_s"])
@pytest.mark.parametrize(("value", "fragment"), BAD_COSTS)
def test_linear_cost_coefficients(name: str, value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=rf"LinearCostModel\.{name} must be .*{fragment}"):
        LinearCostModel(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan, "25e9"])
def test_bandwidths_must_be_finite_and_positive(value: object) -> None:
    for cls, extra in ((LinearCostModel, {}), (TableCostModel, {"args": (0.0, 0.0, 0.0, 0.0)})):
        with pytest.raises(ValueError, match=rf"{cls.__name__}\.host_link_bytes_per_s must be"):
            cls(*extra.get("args", ()), host_link_bytes_per_s=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 2.0}, r"RooflineCostModel\.tp must be an integer >= 1, got 2\.0"),
        ({"tp": True}, r"RooflineCostModel\.tp must be an integer >= 1, got True"),
        ({"tp": 0}, r"RooflineCostModel\.tp must be an integer >= 1, got 0"),
        ({"eta_memory": math.nan}, r"eta_memory must be a finite number > 0"),
        ({"eta_compute": "0.7"}, r"eta_compute must be a finite number > 0, got '0\.7'"),
        ({"eta_link": 1.5}, r"eta_link must be in \(0, 1\]"),
        ({"cpu_overhead_s": math.inf}, r"cpu_overhead_s must be a finite number >= 0"),
        ({"elem_floor_s": "25e-6"}, r"elem_floor_s must be a finite number >= 0"),
        ({"cpu_per_seq_s": -1e-6}, r"cpu_per_seq_s must be a finite number >= 0"),
    ],
)
def test_roofline_coefficients(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RooflineCostModel(MODELS["llama-2-7b"], GPUS["h200"], **kwargs)


def test_roofline_checks_model_gpu_and_normalises_tp() -> None:
    with pytest.raises(ValueError, match=r"RooflineCostModel\.model must be a ModelSpec"):
        RooflineCostModel("llama-2-7b", GPUS["h200"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"RooflineCostModel\.gpu must be a GpuSpec"):
        RooflineCostModel(MODELS["llama-2-7b"], "h200")  # type: ignore[arg-type]
    model = RooflineCostModel(MODELS["llama-2-70b"], GPUS["h200"], tp=np.int64(4))
    assert type(model.tp) is int and model.tp == 4


@pytest.mark.parametrize("name", ["intercept_s", "prefill_token_s", "decode_seq_s", "kv_token_s",
                                  "attn_q_sq_s"])
@pytest.mark.parametrize(("value", "fragment"), [v for v in BAD_COSTS if v[1] != ">= 0"])
def test_table_cost_coefficients(name: str, value: object, fragment: str) -> None:
    args = {"intercept_s": 0.0, "prefill_token_s": 0.0, "decode_seq_s": 0.0, "kv_token_s": 0.0}
    with pytest.raises(ValueError, match=rf"TableCostModel\.{name} must be .*{fragment}"):
        TableCostModel(**{**args, name: value})  # type: ignore[arg-type]


def test_table_cost_allows_negative_fitted_terms_but_not_negative_rmse() -> None:
    # from_csv(nonnegative=False) may legitimately fit a negative coefficient
    assert TableCostModel(0.01, 1e-4, -1e-6, 0.0).decode_seq_s == -1e-6
    with pytest.raises(ValueError, match=r"TableCostModel\.rmse_s must be a finite number >= 0"):
        TableCostModel(0.01, 1e-4, 0.0, 0.0, rmse_s=-1.0)


# ------------------------------------------------------------------ Trace.from_arrays


def trace(**kwargs: Any) -> Trace:
    args: dict[str, Any] = {"arrival_s": [0.0, 1.0], "prompt_tokens": [1, 2],
                            "output_tokens": [1, 2]}
    return Trace.from_arrays(**{**args, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # each of these used to become -2**63 through the int64 cast
        ({"prompt_tokens": [1e30, 1]}, r"prompt_tokens\[0\] is 1e\+30; expected an integer >= 1"),
        ({"prompt_tokens": [1, 2**63]}, r"prompt_tokens\[1\] is .*at most 9223372036854775807"),
        ({"prompt_tokens": [2**70, 1]}, r"prompt_tokens\[0\] is 1180591620717411303424"),
        ({"output_tokens": np.array([1, 2**64 - 1], dtype=np.uint64)}, r"output_tokens\[1\]"),
        ({"output_tokens": [np.inf, 1]}, r"output_tokens\[0\] is inf"),
        ({"output_tokens": [1, np.nan]}, r"output_tokens\[1\] is nan"),
        ({"prompt_tokens": [1, None]}, r"prompt_tokens\[1\] is None"),
        # strings and booleans used to be cast to numbers
        ({"prompt_tokens": ["1", "2"]}, r"prompt_tokens\[0\] is '1'; expected an integer >= 1"),
        ({"output_tokens": [True, True]}, r"output_tokens\[0\] is True"),
        # tenant 2**40 used to wrap to 0 in int32, slo_class 40000 to -25536 in int16
        ({"tenant": [2**40, 0]}, r"tenant\[0\] is 1099511627776; .*-2147483648 to 2147483647"),
        ({"tenant": [0, -(2**31) - 1]}, r"tenant\[1\] is -2147483649; expected an integer"),
        ({"slo_class": [0, 40_000]}, r"slo_class\[1\] is 40000; .*-32768 to 32767 \(int16\)"),
        ({"slo_class": [0.5, 0]}, r"slo_class\[0\] is 0\.5; expected an integer"),
        ({"tenant": [1e10, 0]}, r"tenant\[0\] is 10000000000\.0"),
    ],
)
def test_trace_columns_are_checked_before_conversion(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=r"Trace\.from_arrays: " + message):
        trace(**kwargs)


def test_trace_accepts_the_dtype_limits_exactly() -> None:
    t = trace(prompt_tokens=[2**63 - 1, 1], tenant=[2**31 - 1, -(2**31)],
              slo_class=np.array([2**15 - 1, 0], dtype=object), output_tokens=[3.0, 4.0])
    assert t.prompt_tokens.tolist() == [2**63 - 1, 1] and t.output_tokens.tolist() == [3, 4]
    assert t.tenant.tolist() == [2**31 - 1, -(2**31)] and t.slo_class.tolist() == [2**15 - 1, 0]


def test_trace_rebase_that_overflows_is_rejected() -> None:
    # both times are finite, but 1e308 - (-1e308) is inf
    with pytest.raises(ValueError, match=r"arrival_s\[1\]=1e\+308 is too far after"):
        trace(arrival_s=[-1e308, 1e308])


# ------------------------------------------------------------------ loaders

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_OK = "2023-11-16 18:15:46.6805900,374,44"
BURST = "Timestamp,Request tokens,Response tokens"


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def expect_error(path: Path, line: int, field: str, *fragments: str) -> None:
    """Loading ``path`` fails naming the file, line and field (and each fragment)."""
    with pytest.raises(TraceFormatError) as info:
        load_trace_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}, line {line}: {field} "), message
    assert (info.value.line, info.value.field) == (line, field)
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    ("value", "shown"),
    [("99999999999999999999999", "'99999999999999999999999'"), ("1e30", "'1e+30'"),
     ("9223372036854775808", "'9223372036854775808'"), ("inf", "'inf'"),
     ("Infinity", "'inf'")],
)
def test_csv_counts_beyond_exact_range_name_the_line(
    tmp_path: Path, value: str, shown: str
) -> None:
    # these used to reach Trace.from_arrays as -2**63, with no file or line in the message
    azure = write(tmp_path, "a.csv", [AZURE, AZURE_OK, f"2023-11-16 18:15:47.0,{value},5"])
    expect_error(azure, 3, "ContextTokens", shown, "at most 2**53")
    burst = write(tmp_path, "b.csv", [BURST, "0.5,10,5", f"1.5,10,{value}"])
    expect_error(burst, 3, "Response tokens", shown, "at most 2**53")


@pytest.mark.parametrize(("value", "fragment"), [
    ("99999999999999999999999", "at most 2**53"), ("Infinity", "at most 2**53"),
    ("NaN", "an integer >= 1"),
])
def test_jsonl_counts_beyond_range_name_the_line(
    tmp_path: Path, value: str, fragment: str
) -> None:
    lines = ['{"timestamp": 0, "input_length": 5, "output_length": 5}',
             f'{{"timestamp": 1, "input_length": {value}, "output_length": 5}}']
    expect_error(write(tmp_path, "m.jsonl", lines), 2, "input_length", fragment)


def test_timestamp_spans_beyond_float64_name_the_line(tmp_path: Path) -> None:
    burst = write(tmp_path, "b.csv", [BURST, "-1e308,10,5", "1e308,10,5"])
    expect_error(burst, 3, "Timestamp", "'1e+308'", "finite in float64")
    lines = ['{"timestamp": -1e308, "input_length": 5, "output_length": 5}',
             '{"timestamp": 1e308, "input_length": 5, "output_length": 5}']
    expect_error(write(tmp_path, "m.jsonl", lines), 2, "timestamp", "finite in float64")


@pytest.mark.parametrize("stamp", [
    "9999-11-16 18:15:46.6805900",  # nanosecond digits: pandas gives NaT
    "2262-04-12 00:00:00",  # second precision: pandas 3 parses it, as_unit("ns") then raised
    "1000-01-01 00:00:00.123456",
    "2263-01-01 00:00:00+00:00",
])
def test_out_of_range_dates_name_the_line(tmp_path: Path, stamp: str) -> None:
    path = write(tmp_path, "a.csv", [AZURE, AZURE_OK, f"{stamp},10,5"])
    expect_error(path, 3, "TIMESTAMP", repr(stamp), "between 1677-09-21 and 2262-04-11")


def test_dates_centuries_apart_do_not_wrap(tmp_path: Path) -> None:
    # a span over 292 years overflows int64 nanoseconds; it must not become negative
    path = write(tmp_path, "a.csv", [AZURE, "1678-01-01 00:00:00,10,5", "2261-01-01 00:00:00,10,5"])
    years = load_trace_file(path).arrival_s[-1] / (365.2425 * 86400)
    assert years == pytest.approx(583, abs=1)


@pytest.mark.parametrize("name", ["a.csv", "m.jsonl", "a.csv.gz"])
@pytest.mark.parametrize("bad_line", [1, 3])
def test_non_utf8_files_name_file_and_line(tmp_path: Path, name: str, bad_line: int) -> None:
    if name.startswith("m"):
        lines = [b'{"timestamp": %d, "input_length": 5, "output_length": 5}' % i for i in range(3)]
    else:
        lines = [AZURE.encode(), AZURE_OK.encode(), b"2023-11-16 18:15:47.0,10,5"]
    lines[bad_line - 1] += b"\xff"  # a latin-1 byte, invalid as UTF-8
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    expect_error(path, bad_line, "line", "expected UTF-8 text", "not UTF-8 text: byte 0xff")
