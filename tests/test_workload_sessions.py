"""Multi-turn sessions: the agent-session loader, synthetic sessions, prefix-reuse figures."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cbgym.workload import (
    SessionDataWarning,
    SessionFormatError,
    Trace,
    TraceFormatError,
    TraceNotFoundError,
    known_names,
    load_agent_sessions,
    load_mooncake,
    load_trace,
    load_trace_file,
    prefix_reuse,
    previous_in_session,
    synthetic_sessions,
)
from cbgym.workload.loaders import sniff_format
from cbgym.workload.prefix_reuse import leading_hits

TRACE_DIR = os.environ.get("CBGYM_TRACE_DIR")
SESSION_EXTRAS = {"hash_ids", "hash_block_tokens", "session", "turn", "prev", "think_time_s"}


def real(relative: str) -> Path:
    """A file or folder under the real trace directory, or skip the test."""
    if not TRACE_DIR:
        pytest.skip("CBGYM_TRACE_DIR is not set")
    path = Path(TRACE_DIR) / relative
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture(scope="module")
def agent() -> Trace:
    folder = real("agent-sessions")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SessionDataWarning)
        return load_agent_sessions(folder)


def by_session(trace: Trace) -> dict[int, np.ndarray]:
    """Each session's trace positions, in turn order."""
    session, turn = trace.extra["session"], trace.extra["turn"]
    out: dict[int, np.ndarray] = {}
    for s in np.unique(session):
        rows = np.flatnonzero(session == s)
        out[int(s)] = rows[np.argsort(turn[rows])]
    return out


def check_links(trace: Trace) -> None:
    """prev is the same session's previous turn; extras are aligned and arrivals sorted."""
    prev, session, turn = (trace.extra[k] for k in ("prev", "session", "turn"))
    assert np.all(np.diff(trace.arrival_s) >= 0)
    first = prev < 0
    assert np.array_equal(first, turn == 0)
    i = np.flatnonzero(~first)
    assert np.all(prev[i] < i)
    assert np.array_equal(session[prev[i]], session[i])
    assert np.array_equal(turn[prev[i]], turn[i] - 1)
    assert np.array_equal(previous_in_session(trace), prev)


# --------------------------------------------------------------------------- real agent sessions


def test_real_agent_sessions_load(agent: Trace) -> None:
    folder = real("agent-sessions")
    with pytest.warns(SessionDataWarning) as record:
        load_agent_sessions(folder)
    assert [(w.message.count, w.message.total) for w in record] == [(7, 996)]  # type: ignore
    assert len(agent) == 996 and len(np.unique(agent.extra["session"])) == 40
    assert SESSION_EXTRAS | {"session_id", "model", "api_time_s", "ttft_s"} == set(agent.extra)
    assert np.all(agent.extra["hash_block_tokens"] == 64)
    check_links(agent)


def test_real_agent_sessions_match_files(agent: Trace) -> None:
    files = sorted(real("agent-sessions").glob("*.json"))
    rows = by_session(agent)
    ids = agent.extra["hash_ids"]
    for k, path in enumerate(files):
        doc = json.loads(path.read_text())
        mine = rows[k]
        assert len(mine) == len(doc["requests"])
        mapping: dict[int, int] = {}
        for r, req in zip(mine, doc["requests"], strict=True):
            assert agent.extra["session_id"][r] == doc["id"]
            assert (agent.prompt_tokens[r], agent.output_tokens[r]) == (req["in"], req["out"])
            if "think_time" in req:
                assert agent.extra["think_time_s"][r] == req["think_time"]
            assert agent.arrival_s[r] == req["t"]  # every session starts at 0
            assert len(ids[r]) == math.ceil(req["in"] / 64)
            for old, new in zip(req["hash_ids"], ids[r], strict=False):
                assert mapping.setdefault(old, new) == new
        assert len(set(mapping.values())) == len(mapping)  # the remap is one to one


def test_real_agent_ids_never_shared_across_sessions(agent: Trace) -> None:
    owners: dict[int, set[int]] = defaultdict(set)
    uses: dict[int, int] = defaultdict(int)
    for ids, s in zip(agent.extra["hash_ids"], agent.extra["session"], strict=True):
        for h in ids:
            owners[h].add(int(s))
            uses[h] += 1
    assert all(len(o) == 1 for o in owners.values())
    assert sorted(owners) == list(range(len(owners)))  # dense from 0
    # the fresh id of a partial last block is used once, by its own request
    for ids, prompt in zip(agent.extra["hash_ids"], agent.prompt_tokens, strict=True):
        if prompt % 64:
            assert uses[ids[-1]] == 1


def test_real_agent_stagger(agent: Trace) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SessionDataWarning)
        staggered = load_agent_sessions(real("agent-sessions"), stagger_s=600.0)
    check_links(staggered)
    order = np.lexsort((agent.extra["turn"], agent.extra["session"]))
    again = np.lexsort((staggered.extra["turn"], staggered.extra["session"]))
    np.testing.assert_allclose(
        staggered.arrival_s[again],
        agent.arrival_s[order] + 600.0 * agent.extra["session"][order])
    assert np.array_equal(staggered.prompt_tokens[again], agent.prompt_tokens[order])


def test_real_agent_reuse(agent: Trace) -> None:
    stats = prefix_reuse(agent)
    assert stats["token_hit_fraction"] == pytest.approx(0.91, abs=0.005)  # README: about 91%
    assert stats["spearman_prompt_uncached"] == pytest.approx(0.09, abs=0.01)


# --------------------------------------------------------------------------- real Mooncake


@pytest.mark.parametrize(
    ("filename", "blocks", "rho", "full_only"),
    [("conversation_trace.jsonl", 0.366, 0.66, 0.382),
     ("synthetic_trace.jsonl", 0.640, 0.58, 0.659)],
)
def test_mooncake_published_reuse(filename: str, blocks: float, rho: float,
                                  full_only: float) -> None:
    trace = load_mooncake(real(f"mooncake/{filename}"))
    assert np.all(trace.extra["hash_block_tokens"] == 512)
    stats = prefix_reuse(trace)
    # the published figure counts every id, the partial last block's too
    assert abs(stats["block_hit_fraction"] - blocks) <= 0.001
    assert abs(stats["spearman_prompt_uncached"] - rho) <= 0.01
    assert prefix_reuse(trace, full_blocks_only=True)["block_hit_fraction"] == pytest.approx(
        full_only, abs=0.001)


# --------------------------------------------------------------------------- small files


def request(t: float, prompt: int, out: int = 5, ids: list[int] | None = None,
            **more: Any) -> dict[str, Any]:
    hashes = list(range(1, prompt // 4 + 1)) if ids is None else ids
    return {"t": t, "in": prompt, "out": out, "hash_ids": hashes, "think_time": 1.0,
            "api_time": 0.5, **more}


def session_file(folder: Path, name: str, reqs: list[Any], **top: Any) -> Path:
    doc = {"id": name, "block_size": 4, "hash_id_scope": "local", "tool_tokens": 0,
           "system_tokens": 0, "requests": reqs, **top}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({k: v for k, v in doc.items() if v is not None}))
    return path


def expect(path: Path, request_index: int | None, field: str, *fragments: str) -> None:
    with pytest.raises(SessionFormatError) as info:
        load_agent_sessions(path)
    error = info.value
    message = str(error)
    assert isinstance(error, TraceFormatError) and str(path) in message, message
    assert error.field == field and error.request == request_index, message
    assert error.line == (0 if request_index is None else request_index + 1)
    for fragment in (field, *fragments):
        assert fragment in message, message


def test_sessions_sorted_remapped_and_linked(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    session_file(folder, "a", [request(0, 9), request(10, 13, think_time=2.5)])
    session_file(folder, "b", [request(5, 8)])  # the same file ids as a: local, not shared
    trace = load_agent_sessions(folder)
    assert trace.prompt_tokens.tolist() == [9, 8, 13]
    assert trace.extra["session"].tolist() == [0, 1, 0]
    assert trace.extra["turn"].tolist() == [0, 0, 1]
    assert trace.extra["prev"].tolist() == [-1, -1, 0]
    assert trace.extra["think_time_s"].tolist() == [1.0, 1.0, 2.5]
    assert list(trace.extra["session_id"]) == ["a", "b", "a"]
    # a's file ids 1, 2, 3 -> 0, 1, 2 and partial blocks fresh; b's 1, 2 -> its own range
    assert list(trace.extra["hash_ids"]) == [(0, 1, 3), (5, 6), (0, 1, 2, 4)]
    check_links(trace)
    assert load_agent_sessions(folder, stagger_s=10.0).arrival_s.tolist() == [0.0, 10.0, 15.0]


def test_global_scope_shares_ids(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    session_file(folder, "a", [request(0, 8)], hash_id_scope="global")
    session_file(folder, "b", [request(0, 12)], hash_id_scope="global")
    assert list(load_agent_sessions(folder).extra["hash_ids"]) == [(0, 1), (0, 1, 2)]


def test_one_file_and_dispatch(tmp_path: Path) -> None:
    path = session_file(tmp_path, "a", [request(0, 9)])
    assert sniff_format(path) == "agent-sessions"
    assert len(load_trace_file(path)) == 1 and len(load_trace(path)) == 1
    assert len(load_trace(tmp_path)) == 1  # a folder path
    line = tmp_path / "m.json"
    line.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1}) + "\n")
    assert sniff_format(line) == "mooncake"


def test_zero_output_is_raised_to_one(tmp_path: Path) -> None:
    path = session_file(tmp_path, "a", [request(0, 9, out=0), request(1, 9)])
    with pytest.warns(SessionDataWarning, match="1 of 2 requests: out == 0 raised to 1"):
        trace = load_agent_sessions(path)
    assert trace.output_tokens.tolist() == [1, 5]


def test_missing_think_time_is_estimated(tmp_path: Path) -> None:
    first = request(0, 9)
    del first["think_time"]
    second = request(10, 9)
    del second["think_time"]
    path = session_file(tmp_path, "a", [first, second])
    with pytest.warns(SessionDataWarning, match="2 of 2 requests: no think_time"):
        trace = load_agent_sessions(path)
    assert trace.extra["think_time_s"].tolist() == [0.0, 9.5]  # 10 s gap less 0.5 s api time


@pytest.mark.parametrize(
    ("change", "index", "field", "fragment"),
    [
        ({"in": None}, 1, "requests[1].in", "is missing"),
        ({"hash_ids": None}, 1, "requests[1].hash_ids", "is missing"),
        ({"in": 0}, 1, "requests[1].in", "integer >= 1"),
        ({"in": 8.5}, 1, "requests[1].in", "8.5"),
        ({"out": -1}, 1, "requests[1].out", "integer >= 0"),
        ({"out": "5"}, 1, "requests[1].out", 'is "5"'),
        ({"hash_ids": 7}, 1, "requests[1].hash_ids", "a list of integer block ids"),
        ({"hash_ids": [1, "x"]}, 1, "requests[1].hash_ids[1]", "integer block id"),
        ({"hash_ids": [1, True]}, 1, "requests[1].hash_ids[1]", "integer block id"),
        ({"hash_ids": [1, 2**70]}, 1, "requests[1].hash_ids[1]", "int64"),
        ({"hash_ids": [1, 2, 3]}, 1, "requests[1].hash_ids", "2 ids, one per full block (it has 3"),
        ({"hash_ids": [1]}, 1, "requests[1].hash_ids", "is [1]; expected floor(in"),
        ({"t": -1}, 1, "requests[1].t", ">= 0"),
        ({"t": 0.5}, 1, "requests[1].t", "requests[0].t = 1"),
        ({"think_time": -2}, 1, "requests[1].think_time", ">= 0"),
        ({"api_time": "slow"}, 1, "requests[1].api_time", "finite number"),
        ({"hash_ids": [2, 1]}, 1, "requests[1].hash_ids[0]", "chained prefix ids"),
    ],
)
def test_bad_request(tmp_path: Path, change: dict[str, Any], index: int, field: str,
                     fragment: str) -> None:
    bad = request(2, 8)
    for key, value in change.items():
        if value is None:
            del bad[key]
        else:
            bad[key] = value
    path = session_file(tmp_path, "a", [request(1, 8), bad])
    expect(path, index, field, fragment)


def test_chain_break_across_requests(tmp_path: Path) -> None:
    # id 9 after 1 in one request, after 5 in the next: not a prefix identity
    path = session_file(tmp_path, "a", [request(0, 8, ids=[1, 9]), request(1, 8, ids=[5, 9])])
    expect(path, 1, "requests[1].hash_ids[1]", "after 1 in requests[0]")


@pytest.mark.parametrize(
    ("top", "field", "fragment"),
    [
        ({"block_size": None}, "block_size", "is missing"),
        ({"id": None}, "id", "is missing"),
        ({"requests": None}, "requests", "is missing"),
        ({"requests": []}, "requests", "non-empty list"),
        ({"block_size": 0}, "block_size", "integer >= 1"),
        ({"hash_id_scope": "world"}, "hash_id_scope", "'local' or 'global'"),
    ],
)
def test_bad_session(tmp_path: Path, top: dict[str, Any], field: str, fragment: str) -> None:
    path = session_file(tmp_path, "a", [request(0, 8)], **top)
    expect(path, None, field, fragment)


def test_bad_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    expect(empty, None, "folder", "at least one session *.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"id": "a", "requests": [')
    expect(broken, None, "file", "one JSON object")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    expect(listed, None, "file", "one session")
    twice = tmp_path / "twice"
    session_file(twice, "a", [request(0, 8)])
    (twice / "copy.json").write_text((twice / "a.json").read_text())
    expect(twice, None, "id", "no other file has")
    with pytest.raises(FileNotFoundError):
        load_agent_sessions(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="stagger_s"):
        load_agent_sessions(twice, stagger_s=-1.0)


# --------------------------------------------------------------------------- synthetic sessions


def relabel(rows: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Ids renumbered by first appearance: equal patterns compare equal."""
    seen: dict[int, int] = {}
    return [tuple(seen.setdefault(h, len(seen)) for h in row) for row in rows]


def in_session_order(trace: Trace) -> list[int]:
    return np.lexsort((trace.extra["turn"], trace.extra["session"])).tolist()


def test_synthetic_tiny_ids_exactly() -> None:
    # B = 4, a 6-token system prompt shared by both sessions, 3-token user turns, 2-token replies:
    # turn 0 is 9 tokens (sys block, own block, partial), turn 1 is 9 + 2 + 3 = 14 tokens
    trace = synthetic_sessions(2, turns=(2, 2), system_prompt_tokens=6, num_system_prompts=1,
                               user_tokens=3, output_tokens=2, block_tokens=4, think_time_s=0.0)
    order = in_session_order(trace)
    assert trace.prompt_tokens[order].tolist() == [9, 14, 9, 14]
    rows = [trace.extra["hash_ids"][i] for i in order]
    assert relabel(rows) == [(0, 1, 2), (0, 1, 3, 4), (0, 5, 6), (0, 5, 7, 8)]


def test_synthetic_same_seed_same_trace() -> None:
    a, b = synthetic_sessions(30, seed=5), synthetic_sessions(30, seed=5)
    for column in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, column), getattr(b, column))
    assert set(a.extra) == set(b.extra) == SESSION_EXTRAS | {"system_prompt", "user_tokens"}
    for key in a.extra:
        assert list(a.extra[key]) == list(b.extra[key])
    assert not np.array_equal(a.prompt_tokens, synthetic_sessions(30, seed=6).prompt_tokens)
    # the load knobs move arrivals only
    c = synthetic_sessions(30, seed=5, session_rate=3.0, think_time_s=1.0, nominal_tpot_s=0.1)
    assert sorted(c.prompt_tokens.tolist()) == sorted(a.prompt_tokens.tolist())
    assert not np.array_equal(a.arrival_s, c.arrival_s)


@pytest.mark.parametrize(
    "config",
    [
        {"system_prompt_tokens": 100, "num_system_prompts": 3, "block_tokens": 16},
        {"system_prompt_tokens": 96, "num_system_prompts": 2, "block_tokens": 16},
        {"system_prompt_tokens": [0, 7, 64], "num_system_prompts": 3, "block_tokens": 8},
        {"system_prompt_tokens": 300, "num_system_prompts": 1, "block_tokens": 64,
         "turns": 3.0},
    ],
)
def test_synthetic_ids_match_contents(config: dict[str, Any]) -> None:
    """Full-block ids are equal exactly when the token prefixes are: a token model where
    position i of session s holds ('sys', p, i) inside system prompt p, else ('s', s, i)."""
    trace = synthetic_sessions(25, seed=1, **config)
    block = int(config["block_tokens"])
    sys_len = np.broadcast_to(np.asarray(config["system_prompt_tokens"]),
                              (int(config["num_system_prompts"]),))
    prompt, output = trace.prompt_tokens, trace.output_tokens
    ids, prev = trace.extra["hash_ids"], trace.extra["prev"]
    session, system = trace.extra["session"], trace.extra["system_prompt"]
    check_links(trace)
    owner: dict[int, tuple[Any, ...]] = {}
    partial_uses: dict[int, int] = defaultdict(int)
    for r in range(len(trace)):
        assert len(ids[r]) == math.ceil(prompt[r] / block)
        if prev[r] >= 0:  # prompts extend the previous prompt and response
            p = prev[r]
            assert prompt[r] == prompt[p] + output[p] + trace.extra["user_tokens"][r]
            assert ids[r][: prompt[p] // block] == ids[p][: prompt[p] // block]
        else:
            assert prompt[r] == sys_len[system[r]] + trace.extra["user_tokens"][r]
        for j, h in enumerate(ids[r]):
            if (j + 1) * block > prompt[r]:
                partial_uses[h] += 1
                continue
            content = (("sys", int(system[r]), j) if (j + 1) * block <= sys_len[system[r]]
                       else ("s", int(session[r]), j))
            assert owner.setdefault(h, content) == content
    assert len(set(owner.values())) == len(owner)  # one id per distinct content
    assert all(n == 1 for n in partial_uses.values()) and not set(partial_uses) & set(owner)


def test_synthetic_shared_system_prompt_blocks() -> None:
    trace = synthetic_sessions(40, system_prompt_tokens=160, num_system_prompts=2,
                               block_tokens=16, seed=2)
    system = trace.extra["system_prompt"]
    for p in (0, 1):
        heads = {ids[:10] for ids in trace.extra["hash_ids"][system == p]}
        assert len(heads) == 1
    assert len({ids[0] for ids in trace.extra["hash_ids"]}) == 2


def test_synthetic_open_loop_arrivals() -> None:
    trace = synthetic_sessions(20, think_time_s=3.0, nominal_tpot_s=0.05, seed=3)
    prev = trace.extra["prev"]
    i = np.flatnonzero(prev >= 0)
    expected = (trace.arrival_s[prev[i]] + 0.05 * trace.output_tokens[prev[i]]
                + trace.extra["think_time_s"][i])
    np.testing.assert_allclose(trace.arrival_s[i], expected)
    assert np.all(trace.extra["think_time_s"][prev < 0] == 0)
    assert trace.extra["think_time_s"][i].mean() == pytest.approx(3.0, rel=0.3)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"num_sessions": 0}, "num_sessions"), ({"turns": (3, 2)}, "turns"),
     ({"turns": 0.5}, "turns"), ({"block_tokens": 0}, "block_tokens"),
     ({"session_rate": 0.0}, "session_rate"), ({"think_time_s": -1.0}, "think_time_s"),
     ({"user_tokens": 0}, "user_tokens"), ({"system_prompt_tokens": -1}, "system_prompt")],
)
def test_synthetic_bad_arguments(kwargs: dict[str, Any], fragment: str) -> None:
    kwargs.setdefault("num_sessions", 3)
    with pytest.raises(ValueError, match=fragment):
        synthetic_sessions(**kwargs)


# --------------------------------------------------------------------------- prefix_reuse


def test_prefix_reuse_by_hand() -> None:
    trace = Trace.from_arrays([0, 1, 2], [12, 10, 8], [1, 1, 1],
                              extra={"hash_ids": _objects([(1, 2, 3), (1, 2, 9), (1, 4)])})
    assert leading_hits(trace).tolist() == [0, 2, 1]
    stats = prefix_reuse(trace, 4)
    assert (stats["hit_blocks"], stats["blocks"]) == (3, 8)
    assert (stats["hit_tokens"], stats["prompt_tokens"]) == (12, 30)  # 0 + 8 + 4
    assert stats["uncached_tokens"] == 18
    with pytest.raises(ValueError, match="hash_block_tokens"):
        prefix_reuse(trace)
    tagged = Trace.from_arrays([0], [8], [1], extra={"hash_ids": _objects([(1, 2)]),
                                                     "hash_block_tokens": [4]})
    with pytest.raises(ValueError, match="re-blocked"):
        prefix_reuse(tagged, 16)


def test_previous_in_session_after_slicing() -> None:
    trace = synthetic_sessions(30, seed=4)
    window = trace[40:120]
    prev = previous_in_session(window)
    i = np.flatnonzero(prev >= 0)
    assert np.array_equal(window.extra["session"][prev[i]], window.extra["session"][i])
    assert np.array_equal(window.extra["turn"][prev[i]], window.extra["turn"][i] - 1)
    assert np.all(prev[i] == window.extra["prev"][i] - 40)


def _objects(rows: list[tuple[int, ...]]) -> np.ndarray:
    column = np.empty(len(rows), dtype=object)
    column[:] = rows
    return column


# --------------------------------------------------------------------------- catalogue


def test_catalogue_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("agent-sessions", "mooncake-conversation", "mooncake-synthetic",
                 "synthetic-sessions"):
        assert name in known_names()
    assert load_trace("synthetic-sessions").name == "synthetic-sessions"
    monkeypatch.delenv("CBGYM_TRACE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with pytest.raises(TraceNotFoundError, match="does not download"):
        load_trace("mooncake-conversation", download=False)


def test_catalogue_real(monkeypatch: pytest.MonkeyPatch) -> None:
    real("agent-sessions")
    real("mooncake/conversation_trace.jsonl")
    monkeypatch.setenv("CBGYM_TRACE_DIR", str(TRACE_DIR))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SessionDataWarning)
        agent = load_trace("agent-sessions")
    assert (agent.name, len(agent)) == ("agent-sessions", 996)
    conversation = load_trace("mooncake-conversation")
    assert (conversation.name, len(conversation)) == ("mooncake-conversation", 12_031)
    assert np.all(conversation.extra["hash_block_tokens"] == 512)
