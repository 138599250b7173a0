"""Trace: validation in from_arrays, immutability, windows and rebasing."""

from __future__ import annotations

import numpy as np
import pytest

from cbgym.workload import Trace


def make(n: int = 5, start: float = 10.0) -> Trace:
    arrival = start + np.arange(n, dtype=float)
    return Trace.from_arrays(
        arrival, np.arange(1, n + 1) * 10, np.arange(1, n + 1),
        tenant=np.arange(n) % 2, slo_class=np.zeros(n), name="t",
        extra={"tag": np.array([f"r{i}" for i in range(n)], dtype=object)},
    )


def test_from_arrays_rebases_and_types() -> None:
    trace = make()
    assert trace.arrival_s[0] == 0.0
    np.testing.assert_allclose(trace.arrival_s, [0, 1, 2, 3, 4])
    assert trace.arrival_s.dtype == np.float64
    assert trace.prompt_tokens.dtype == np.int64 and trace.output_tokens.dtype == np.int64
    assert trace.tenant.dtype == np.int32 and trace.slo_class.dtype == np.int16
    assert len(trace) == 5 and trace.name == "t"


def test_from_arrays_without_rebase_keeps_times() -> None:
    trace = Trace.from_arrays([5.0, 6.0], [1, 2], [3, 4], rebase=False)
    np.testing.assert_allclose(trace.arrival_s, [5.0, 6.0])


def test_defaults_for_tenant_and_slo() -> None:
    trace = Trace.from_arrays([0.0, 1.0], [1, 2], [3, 4])
    assert trace.tenant.tolist() == [0, 0] and trace.slo_class.tolist() == [0, 0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"arrival_s": [0.0, np.nan]}, r"arrival_s\[1\].*finite"),
        ({"arrival_s": [0.0, np.inf]}, r"arrival_s\[1\].*finite"),
        ({"arrival_s": [2.0, 1.0]}, r"arrival_s\[1\].*before.*non-decreasing"),
        ({"prompt_tokens": [1, 0]}, r"prompt_tokens\[1\].*integer >= 1"),
        ({"output_tokens": [1.5, 2]}, r"output_tokens\[0\].*integer >= 1"),
        ({"output_tokens": [1, -3]}, r"output_tokens\[1\].*integer >= 1"),
        ({"prompt_tokens": [1, 2, 3]}, r"prompt_tokens has 3 entries"),
        ({"tenant": [0]}, r"tenant has 1 entries"),
        ({"extra": {"x": [1, 2, 3]}}, r"extra\['x'\] has 3 entries"),
    ],
)
def test_from_arrays_rejects(kwargs: dict, match: str) -> None:
    args = {"arrival_s": [0.0, 1.0], "prompt_tokens": [1, 2], "output_tokens": [1, 2]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Trace.from_arrays(**args)


def test_arrays_are_read_only() -> None:
    trace = make()
    for column in (trace.arrival_s, trace.prompt_tokens, trace.output_tokens, trace.tenant,
                   trace.slo_class, trace.extra["tag"]):
        with pytest.raises(ValueError, match="read-only"):
            column[0] = 1


def test_fields_cannot_be_reassigned() -> None:
    trace = make()
    with pytest.raises(AttributeError):
        trace.name = "other"  # type: ignore[misc]


def test_from_arrays_copies_its_inputs() -> None:
    prompt = np.array([1, 2])
    trace = Trace.from_arrays([0.0, 1.0], prompt, [1, 1])
    prompt[0] = 99
    assert trace.prompt_tokens[0] == 1


def test_slicing_rebases_and_carries_columns() -> None:
    part = make()[2:4]
    assert len(part) == 2
    np.testing.assert_allclose(part.arrival_s, [0.0, 1.0])
    assert part.prompt_tokens.tolist() == [30, 40]
    assert part.tenant.tolist() == [0, 1]
    assert part.extra["tag"].tolist() == ["r2", "r3"]


def test_indexing_by_integer_is_rejected() -> None:
    with pytest.raises(TypeError):
        make()[0]  # type: ignore[index]


def test_window() -> None:
    trace = make()
    assert trace.window(1, 3).output_tokens.tolist() == [2, 3, 4]
    for start, count in ((-1, 2), (0, 0), (3, 3)):
        with pytest.raises(ValueError, match="outside a trace of 5"):
            trace.window(start, count)


def test_between_is_half_open_and_rebased() -> None:
    trace = make()
    part = trace.between(1.0, 3.0)
    assert part.prompt_tokens.tolist() == [20, 30]
    assert part.arrival_s.tolist() == [0.0, 1.0]
    assert len(trace.between(10.0, 20.0)) == 0


def test_duration_rate_and_repr() -> None:
    trace = make()
    assert trace.duration_s == 4.0
    assert trace.rate == pytest.approx(1.0)
    assert "5 requests" in repr(trace)
    assert "0 requests" in repr(trace.between(100.0, 200.0))


def test_with_arrivals() -> None:
    trace = make()
    faster = trace.with_arrivals(trace.arrival_s / 2, name="x2")
    assert faster.duration_s == 2.0 and faster.name == "x2"
    assert faster.prompt_tokens.tolist() == trace.prompt_tokens.tolist()
