"""Named traces: resolution order, downloads (mocked; no network), errors, manifest agreement."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cbgym.workload import catalog
from cbgym.workload.catalog import (
    CATALOG,
    TraceChecksumError,
    TraceNotFoundError,
    default_cache_dir,
    load_trace,
)
from tests.conftest import load_script

REPO = Path(__file__).resolve().parents[1]
REAL_TRACE_DIR = os.environ.get("CBGYM_TRACE_DIR")
NAME = "azure-conv-2023"
FILENAME = CATALOG[NAME].filename


def azure_bytes(rows: int) -> bytes:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:15:{10 + i:02d}.0000000,{100 + i},{5 + i}" for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


class FakeResponse(io.BytesIO):
    """What urlopen returns: a readable, closable body with headers."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.headers = {"Content-Length": str(len(data))}


def no_network(*args: object, **kwargs: object) -> FakeResponse:
    raise urllib.error.URLError("network disabled in tests")


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No real network, no real cache, no inherited trace dir, a cold in-process cache."""
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CBGYM_TRACE_DIR", raising=False)
    catalog._load_cached.cache_clear()
    yield
    catalog._load_cached.cache_clear()


def pin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    """Make the catalogue expect ``data`` (tests use small stand-ins for the real file)."""
    entry = dataclasses.replace(CATALOG[NAME], sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(CATALOG, NAME, entry)


def put(directory: Path, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILENAME
    path.write_bytes(data)
    return path


def serve(monkeypatch: pytest.MonkeyPatch, data: bytes) -> list[str]:
    """Answer urlopen with ``data``; returns the list of URLs requested."""
    requested: list[str] = []

    def fake(url: str, timeout: float = 0) -> FakeResponse:
        requested.append(url)
        return FakeResponse(data)

    monkeypatch.setattr(urllib.request, "urlopen", fake)
    return requested


# --------------------------------------------------------------------------- resolution


def test_explicit_path_wins(tmp_path: Path) -> None:
    path = put(tmp_path / "here", azure_bytes(3))
    trace = load_trace(path)
    assert len(trace) == 3 and trace.name == str(path.resolve())
    assert len(load_trace(str(path))) == 3


def test_env_dir_before_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_data, cache_data = azure_bytes(2), azure_bytes(4)
    put(default_cache_dir(), cache_data)
    assert default_cache_dir() == tmp_path / "xdg" / "cbgym" / "traces"
    pin(monkeypatch, cache_data)
    assert len(load_trace(NAME)) == 4 and load_trace(NAME).name == NAME

    catalog._load_cached.cache_clear()
    pin(monkeypatch, env_data)
    put(tmp_path / "b", env_data)
    monkeypatch.setenv("CBGYM_TRACE_DIR", os.pathsep.join([str(tmp_path / "a"),
                                                           str(tmp_path / "b")]))
    assert len(load_trace(NAME)) == 2


def test_cache_dir_argument_replaces_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = azure_bytes(5)
    pin(monkeypatch, data)
    put(tmp_path / "mine", data)
    assert len(load_trace(NAME, cache_dir=tmp_path / "mine")) == 5


def test_default_cache_dir_without_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "cbgym" / "traces"


def test_download_into_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = azure_bytes(6)
    pin(monkeypatch, data)
    requested = serve(monkeypatch, data)
    trace = load_trace(NAME)
    assert requested == [CATALOG[NAME].url]
    assert len(trace) == 6 and trace.name == NAME
    assert sorted(p.name for p in default_cache_dir().iterdir()) == [FILENAME]
    assert (default_cache_dir() / FILENAME).read_bytes() == data
    load_trace(NAME)
    assert len(requested) == 1  # second call: found in the cache


def test_download_checksum_mismatch_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pin(monkeypatch, azure_bytes(6))
    serve(monkeypatch, azure_bytes(7))
    with pytest.raises(TraceChecksumError, match="sha256"):
        load_trace(NAME)
    # Nothing that looks complete (and no temporary file) is left behind.
    assert list(default_cache_dir().iterdir()) == []


def test_found_file_with_wrong_checksum_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pin(monkeypatch, azure_bytes(6))
    path = put(default_cache_dir(), azure_bytes(5))
    with pytest.raises(TraceChecksumError, match=str(path)):
        load_trace(NAME)


def test_offline_error_says_where_to_put_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CBGYM_TRACE_DIR", str(tmp_path / "traces"))
    with pytest.raises(TraceNotFoundError) as info:
        load_trace(NAME)
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    target = default_cache_dir() / FILENAME
    for fragment in (str(tmp_path / "traces" / FILENAME), str(target), CATALOG[NAME].url,
                     "network disabled in tests", "CBGYM_TRACE_DIR", "traces/fetch.py"):
        assert fragment in message, message


def test_no_download_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("urlopen must not be called")

    monkeypatch.setattr(urllib.request, "urlopen", forbidden)
    with pytest.raises(TraceNotFoundError, match=r"download=False") as info:
        load_trace(NAME, download=False)
    assert "CBGYM_TRACE_DIR: not set" in str(info.value)


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(ValueError, match="unknown trace name 'azure-conv-2032'") as info:
        load_trace("azure-conv-2032")
    for name in [*CATALOG, "synthetic-conv", "synthetic-code"]:
        assert name in str(info.value)


def test_missing_explicit_path(tmp_path: Path) -> None:
    with pytest.raises(TraceNotFoundError, match="no trace file at"):
        load_trace(tmp_path / "missing.csv")
    with pytest.raises(TraceNotFoundError, match="no trace file at"):
        load_trace("some/dir/missing.csv")


def test_synthetic_names() -> None:
    trace = load_trace("synthetic-code")
    assert trace.name == "synthetic-code" and len(trace) == 8_819
    assert load_trace("synthetic-code") is trace


def test_in_process_cache_keyed_by_mtime(tmp_path: Path) -> None:
    path = put(tmp_path, azure_bytes(3))
    first = load_trace(path)
    assert load_trace(str(path)) is first
    path.write_bytes(azure_bytes(4))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert len(load_trace(path)) == 4


def test_loader_options_pass_through(tmp_path: Path) -> None:
    path = tmp_path / "zero.csv"
    path.write_bytes(azure_bytes(3).replace(b",5\n", b",0\n"))
    with pytest.warns(UserWarning, match="dropped 1"):
        assert len(load_trace(path, drop_zero_output=True)) == 2


# --------------------------------------------------------------------------- manifest and CLI


def test_manifest_agrees_with_catalog() -> None:
    manifest = json.loads((REPO / "traces" / "manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["traces"]}
    assert set(entries) == set(CATALOG)
    for name, entry in CATALOG.items():
        for field, value in dataclasses.asdict(entry).items():
            assert entries[name][field] == value, (name, field)


def test_catalog_entries_are_well_formed() -> None:
    for entry in CATALOG.values():
        assert entry.url.startswith("https://") and entry.url.endswith("/" + entry.filename)
        assert entry.sha256 is None or len(entry.sha256) == 64
        assert entry.licence == "CC-BY-4.0"


def load_fetch_cli() -> Callable[[list[str]], int]:
    return load_script("traces/fetch.py").main


def test_fetch_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> None:
    data = azure_bytes(2)
    pin(monkeypatch, data)
    serve(monkeypatch, data)
    main = load_fetch_cli()
    assert main([NAME, "--dir", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / FILENAME).read_bytes() == data
    assert "sha256 verified" in capsys.readouterr().out
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    assert main([NAME, "--dir", str(tmp_path / "e")]) == 1


@pytest.mark.skipif(not REAL_TRACE_DIR, reason="CBGYM_TRACE_DIR is not set")
def test_real_files_match_pinned_checksums(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBGYM_TRACE_DIR", str(REAL_TRACE_DIR))
    for name in ("azure-conv-2023", "azure-code-2023"):
        entry = CATALOG[name]
        path = Path(str(REAL_TRACE_DIR)) / entry.filename
        if not path.is_file():
            pytest.skip(f"{path} not present")
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256
        trace = load_trace(name)
        assert len(trace) == entry.rows and trace.name == name
        assert trace.duration_s == pytest.approx(entry.span_s, abs=0.1)
