"""Trace file loaders: Azure (2023 and 2024 formats), BurstGPT, Mooncake, and the dispatcher."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cbgym.workload import (
    DroppedRowsWarning,
    TraceFormatError,
    load_azure,
    load_burstgpt,
    load_mooncake,
    load_trace_file,
)
from cbgym.workload.loaders import _parse_timestamps, sniff_format

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_2023 = [
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51.2224670,879,55",
]
AZURE_2024 = [
    "2024-05-10 00:00:00.009930+00:00,2162,5",
    "2024-05-10 00:00:01+00:00,2399,6",
    "2024-05-10 00:00:01.5+00:00,76,15",
    "2024-05-10 00:00:02.037845+00:00,2376,1",
]
BURST_HEADER = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"
)


def write(tmp_path: Path, lines: list[str], name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def azure(tmp_path: Path, rows: list[str]) -> Path:
    return write(tmp_path, [AZURE_HEADER, *rows])


def expect_error(path: Path, line: int, field: str, *fragments: str, **options: object) -> str:
    """Load ``path`` and check the error names the file, line and field (and fragments)."""
    with pytest.raises(TraceFormatError) as info:
        load_trace_file(path, **options)
    message = str(info.value)
    assert str(path) in message and f"line {line}:" in message and field in message, message
    assert (info.value.line, info.value.field) == (line, field)
    for fragment in fragments:
        assert fragment in message, message
    return message


# --------------------------------------------------------------------------- Azure


def test_azure_2023_format(tmp_path: Path) -> None:
    trace = load_azure(azure(tmp_path, AZURE_2023))
    assert len(trace) == 3
    np.testing.assert_allclose(trace.arrival_s, [0.0, 4.314579, 4.541877], atol=1e-9)
    assert trace.prompt_tokens.tolist() == [374, 396, 879]
    assert trace.output_tokens.tolist() == [44, 109, 55]
    assert trace.name.endswith("trace.csv")


def test_azure_2024_mixed_precision_and_offset(tmp_path: Path) -> None:
    trace = load_trace_file(azure(tmp_path, AZURE_2024))
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.99007, 1.49007, 2.027915], atol=1e-9)
    assert trace.output_tokens.tolist() == [5, 6, 15, 1]


def test_azure_tolerates_trailing_blank_lines_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "crlf.csv"
    path.write_bytes(("\r\n".join([AZURE_HEADER, *AZURE_2023]) + "\r\n\r\n\r\n").encode())
    assert len(load_azure(path)) == 3


def test_azure_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, ["TIMESTAMP,ContextTokens", "2023-11-16 18:15:46.6805900,374"])
    expect_error(path, 1, "header", "missing: GeneratedTokens")


def test_azure_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("")
    expect_error(path, 1, "header", "is empty")


def test_azure_header_only(tmp_path: Path) -> None:
    expect_error(azure(tmp_path, []), 2, "row", "at least one data row")


@pytest.mark.parametrize(
    ("bad_row", "field", "fragment"),
    [
        ("2023-11-16 18:15:52.0000000,abc,10", "ContextTokens", "'abc'"),
        ("2023-11-16 18:15:52.0000000,,10", "ContextTokens", "is empty"),
        ("2023-11-16 18:15:52.0000000,12,NaN", "GeneratedTokens", "'NaN'"),
        ("2023-11-16 18:15:52.0000000,12,", "GeneratedTokens", "is empty"),
        ("2023-11-16 18:15:52.0000000,0,10", "ContextTokens", "integer >= 1"),
        ("2023-11-16 18:15:52.0000000,-5,10", "ContextTokens", "'-5'"),
        ("2023-11-16 18:15:52.0000000,12.5,10", "ContextTokens", "'12.5'"),
        ("2023-11-16 18:15:52.0000000,12,-1", "GeneratedTokens", "'-1'"),
        ("not a time,12,10", "TIMESTAMP", "'not a time'"),
        ("2023-13-45 99:00:00,12,10", "TIMESTAMP", "expected a timestamp"),
        (",12,10", "TIMESTAMP", "is empty"),
    ],
)
def test_azure_bad_field_names_line(
    tmp_path: Path, bad_row: str, field: str, fragment: str
) -> None:
    path = azure(tmp_path, [*AZURE_2023, bad_row, "2023-11-16 18:15:53.0000000,5,5"])
    expect_error(path, 5, field, fragment)


def test_azure_zero_output_is_rejected_with_count(tmp_path: Path) -> None:
    rows = [AZURE_2023[0], "2023-11-16 18:15:50.0,10,0", "2023-11-16 18:15:51.0,10,0"]
    expect_error(azure(tmp_path, rows), 3, "GeneratedTokens", "2 of 3 rows", "drop_zero_output")


def test_azure_zero_output_dropped_on_request(tmp_path: Path) -> None:
    rows = [AZURE_2023[0], "2023-11-16 18:15:50.0,10,0", "2023-11-16 18:15:51.0,10,7"]
    with pytest.warns(DroppedRowsWarning, match="dropped 1 of 3 rows") as record:
        trace = load_azure(azure(tmp_path, rows), drop_zero_output=True)
    assert record[0].message.count == 1  # type: ignore[union-attr]
    assert len(trace) == 2 and trace.output_tokens.tolist() == [44, 7]
    assert trace.name.endswith("(dropped 1 zero-output rows)")
    assert trace.arrival_s[1] == pytest.approx(51.0 - 46.68059)


def test_azure_unsorted_names_both_lines(tmp_path: Path) -> None:
    rows = [AZURE_2023[0], AZURE_2023[2], AZURE_2023[1]]
    message = expect_error(azure(tmp_path, rows), 4, "TIMESTAMP", "on line 3", "sorted")
    assert "18:15:50.9951690" in message and "18:15:51.2224670" in message


def test_azure_equal_timestamps_are_fine(tmp_path: Path) -> None:
    assert len(load_azure(azure(tmp_path, [AZURE_2023[0], AZURE_2023[0]]))) == 2


def test_azure_too_many_fields(tmp_path: Path) -> None:
    path = azure(tmp_path, [*AZURE_2023[:2], "2023-11-16 18:15:52.0,1,2,3"])
    expect_error(path, 4, "row", "3 comma-separated fields")


def test_azure_blank_line_keeps_line_numbers(tmp_path: Path) -> None:
    path = azure(tmp_path, [AZURE_2023[0], "", AZURE_2023[1]])
    expect_error(path, 3, "TIMESTAMP", "is empty")


def test_azure_reports_earliest_bad_line(tmp_path: Path) -> None:
    rows = [AZURE_2023[0], "2023-11-16 18:15:52.0,10,x", "2023-11-16 18:15:53.0,y,10"]
    expect_error(azure(tmp_path, rows), 3, "GeneratedTokens")


def test_trace_format_error_is_value_error() -> None:
    error = TraceFormatError("f.csv", 3, "ContextTokens", "x", "an integer >= 1")
    assert isinstance(error, ValueError)
    assert str(error) == "f.csv, line 3: ContextTokens is 'x'; expected an integer >= 1"


# --------------------------------------------------------------------------- BurstGPT


def burst(tmp_path: Path) -> Path:
    rows = [
        "5,1,0.5,ChatGPT,100,20,120,Conversation log",
        "6,2,0.5,GPT-4,200,0,200,Conversation log",
        "7,3,0.5,ChatGPT,300,0,300,API log",
        "9,4,0.5,GPT-4,400,40,440,API log",
        "9.5,5,0.5,ChatGPT,50,5,55,API log",
    ]
    return write(tmp_path, [BURST_HEADER, *rows], "burst.csv")


def test_burstgpt_drops_failures_and_counts(tmp_path: Path) -> None:
    with pytest.warns(DroppedRowsWarning, match="dropped 2 of 5 rows") as record:
        trace = load_trace_file(burst(tmp_path))
    assert record[0].message.count == 2  # type: ignore[union-attr]
    assert trace.name.endswith("(dropped 2 failed requests)")
    assert trace.prompt_tokens.tolist() == [100, 400, 50]
    assert trace.output_tokens.tolist() == [20, 40, 5]
    np.testing.assert_allclose(trace.arrival_s, [0.0, 4.0, 4.5])


def test_burstgpt_model_filter(tmp_path: Path) -> None:
    with pytest.warns(DroppedRowsWarning, match="dropped 1 of 3 rows"):
        trace = load_burstgpt(burst(tmp_path), model="ChatGPT")
    assert trace.prompt_tokens.tolist() == [100, 50]
    with pytest.warns(DroppedRowsWarning, match="dropped 1 of 2 rows"):
        assert len(load_burstgpt(burst(tmp_path), model=["GPT-4"])) == 1
    with pytest.raises(TraceFormatError, match="at least one successful request"):
        load_burstgpt(burst(tmp_path), model="Claude")


def test_burstgpt_without_failures_keeps_plain_name(tmp_path: Path) -> None:
    path = write(tmp_path, [BURST_HEADER, "1,1,0.1,ChatGPT,10,2,12,API log"], "ok.csv")
    assert load_burstgpt(path).name == str(path)


def test_burstgpt_bad_rows(tmp_path: Path) -> None:
    path = write(tmp_path, [BURST_HEADER, "1,1,0.1,ChatGPT,10,2,12,x", "x,1,0.1,ChatGPT,1,1,2,x"])
    expect_error(path, 3, "Timestamp", "'x'")
    path = write(tmp_path, [BURST_HEADER, "1,1,0.1,ChatGPT,10,-2,8,x"])
    expect_error(path, 2, "Response tokens", "'-2'")
    path = write(tmp_path, [BURST_HEADER, "2,1,0.1,ChatGPT,1,1,2,x", "1,1,0.1,ChatGPT,1,1,2,x"])
    expect_error(path, 3, "Timestamp", "on line 2")
    path = write(tmp_path, [BURST_HEADER, "1,1,0.1,ChatGPT,0,5,5,x"])
    expect_error(path, 2, "Request tokens", "successful request")


def test_burstgpt_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, ["Timestamp,Model,Request tokens", "1,ChatGPT,5"], "b.csv")
    with pytest.raises(TraceFormatError, match="line 1: header"):
        load_burstgpt(path)


# --------------------------------------------------------------------------- Mooncake


def mooncake_lines() -> list[str]:
    records = [
        {"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1, 2]},
        {"timestamp": 0, "input_length": 512, "output_length": 3, "hash_ids": [0]},
        {"timestamp": 1500, "input_length": 100, "output_length": 20, "hash_ids": []},
    ]
    return [json.dumps(r) for r in records]


def test_mooncake_reads_ms_and_hash_ids(tmp_path: Path) -> None:
    trace = load_trace_file(write(tmp_path, mooncake_lines(), "m.jsonl"))
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.0, 1.5])
    assert trace.prompt_tokens.tolist() == [6755, 512, 100]
    hashes = trace.extra["hash_ids"]
    assert hashes.dtype == object and list(hashes) == [(0, 1, 2), (0,), ()]
    assert list(trace[1:3].extra["hash_ids"]) == [(0,), ()]


def test_mooncake_without_hash_ids(tmp_path: Path) -> None:
    line = json.dumps({"timestamp": 3, "input_length": 1, "output_length": 1})
    assert "hash_ids" not in load_mooncake(write(tmp_path, [line], "m.jsonl")).extra


@pytest.mark.parametrize(
    ("bad", "field", "fragment"),
    [
        ("{not json", "line", "a JSON object"),
        ("[1, 2]", "line", "a JSON object"),
        ('{"timestamp": 2000, "input_length": 0, "output_length": 1}', "input_length", "'0'"),
        ('{"timestamp": 2000, "input_length": 5, "output_length": 1.5}', "output_length", "1.5"),
        ('{"timestamp": 2000, "input_length": 5}', "output_length", "is empty"),
        ('{"timestamp": "soon", "input_length": 5, "output_length": 1}', "timestamp", "'soon'"),
        ('{"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": []}', "timestamp",
         "on line 3"),
        ('{"timestamp": 2000, "input_length": 5, "output_length": 1, "hash_ids": 7}',
         "hash_ids", "'7'"),
    ],
)
def test_mooncake_bad_line(tmp_path: Path, bad: str, field: str, fragment: str) -> None:
    # A blank line before the bad one checks that line numbers count blank lines.
    path = write(tmp_path, [*mooncake_lines(), "", bad], "m.jsonl")
    expect_error(path, 5, field, fragment)


def test_mooncake_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("\n\n")
    expect_error(path, 1, "line", "at least one JSON object")


# --------------------------------------------------------------------------- dispatch


def test_sniff_format(tmp_path: Path) -> None:
    assert sniff_format(azure(tmp_path, AZURE_2023)) == "azure"
    assert sniff_format(burst(tmp_path)) == "burstgpt"
    assert sniff_format(write(tmp_path, mooncake_lines(), "m.jsonl")) == "mooncake"
    assert sniff_format(write(tmp_path, mooncake_lines(), "m.txt")) == "mooncake"


def test_unknown_header(tmp_path: Path) -> None:
    path = write(tmp_path, ["a,b,c", "1,2,3"], "other.csv")
    expect_error(path, 1, "header", "Azure header", "BurstGPT header", "Mooncake")


def test_gzip_csv(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join([AZURE_HEADER, *AZURE_2024]) + "\n")
    assert len(load_trace_file(path)) == 4


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no trace file"):
        load_trace_file(tmp_path / "nope.csv")


# --------------------------------------------------------------------------- real 2023 files

TRACE_DIR = os.environ.get("CBGYM_TRACE_DIR")


@pytest.mark.skipif(not TRACE_DIR, reason="CBGYM_TRACE_DIR is not set")
@pytest.mark.parametrize(
    ("filename", "rows", "prompt_mean", "output_mean", "span_s"),
    [
        ("AzureLLMInferenceTrace_conv.csv", 19_366, 1155, 211, 3501.7),
        ("AzureLLMInferenceTrace_code.csv", 8_819, 2048, 28, 3435.9),
    ],
)
def test_real_azure_2023(
    filename: str, rows: int, prompt_mean: float, output_mean: float, span_s: float
) -> None:
    path = Path(str(TRACE_DIR)) / filename
    if not path.is_file():
        pytest.skip(f"{path} not present")
    start = time.perf_counter()
    trace = load_azure(path)
    elapsed = time.perf_counter() - start
    assert len(trace) == rows
    assert trace.prompt_tokens.mean() == pytest.approx(prompt_mean, rel=0.005)
    assert trace.output_tokens.mean() == pytest.approx(output_mean, rel=0.01)
    assert trace.duration_s == pytest.approx(span_s, abs=1.0)
    assert trace.output_tokens.min() >= 1  # no zero-output rows in the 2023 files
    assert elapsed < 0.5, f"loading {filename} took {elapsed:.3f} s"


# --------------------------------------------------------------------------- timestamp parser


@pytest.mark.parametrize(
    ("text", "iso_utc"),
    [
        ("2023-11-16 18:15:46.6805901", "2023-11-16T18:15:46.680590100"),
        ("2024-05-10 00:00:00.009930+00:00", "2024-05-10T00:00:00.009930"),
        ("2024-05-10 00:00:01+00:00", "2024-05-10T00:00:01"),
        ("2024-05-10 00:00:01.5+00:00", "2024-05-10T00:00:01.5"),
        ("2024-05-10T00:00:01.25Z", "2024-05-10T00:00:01.25"),
        ("2024-05-10 02:00:00+02:00", "2024-05-10T00:00:00"),
        ("2024-05-09 17:00:00-07:00", "2024-05-10T00:00:00"),
    ],
)
def test_timestamp_spellings(text: str, iso_utc: str) -> None:
    nanos, ok = _parse_timestamps(pd.Series([text]))
    assert ok.tolist() == [True]
    assert nanos[0] == np.datetime64(iso_utc, "ns").astype(np.int64)


def test_timestamp_rejects() -> None:
    bad = ["", "NaT", "2024-02-30 00:00:00", "2024-05-10 25:00:00", "x" * 48, "16/11/2023 18:15"]
    nanos, ok = _parse_timestamps(pd.Series(["2024-05-10 00:00:00", *bad]))
    assert ok.tolist() == [True] + [False] * len(bad)
