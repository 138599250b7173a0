"""Named traces: find them on disk, or download them once into a user cache.

``load_trace("azure-conv-2023")`` looks, in order, in every directory of ``$CBGYM_TRACE_DIR``
(``os.pathsep``-separated), then in the user cache (``$XDG_CACHE_HOME/cbgym/traces``, by default
``~/.cache/cbgym/traces``), and finally downloads the public file into the cache, checking its
sha256 where one is known. The URLs and checksums live in the package
(:mod:`cbgym.workload.catalog_entries`; the repository's ``traces/manifest.json`` mirrors them)
so that an installed package can fetch by itself.

:data:`LOCAL_TRACES` (the Mooncake traces, the agent sessions, the ServeGen language clients)
are looked for the same way
but never downloaded: put them in a ``$CBGYM_TRACE_DIR`` directory (or the cache) under the
relative path their entry names.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

# (the catalogue's names are re-exported: callers and tests import them from here)
from cbgym.workload.catalog_entries import (
    CATALOG,
    DERIVED,
    LOCAL_TRACES,
    SYNTHETIC_NAMES,
    LocalTraceEntry,
    TraceEntry,
    known_names,
)
from cbgym.workload.loaders import load_trace_file
from cbgym.workload.servegen import servegen_tenants
from cbgym.workload.session_synth import synthetic_sessions
from cbgym.workload.sessions import load_agent_sessions
from cbgym.workload.synthetic import synthetic_trace
from cbgym.workload.trace import Trace

__all__ = [
    "CATALOG",
    "LOCAL_TRACES",
    "SYNTHETIC_NAMES",
    "TRACE_DIR_ENV",
    "TraceChecksumError",
    "LocalTraceEntry",
    "TraceEntry",
    "TraceNotFoundError",
    "default_cache_dir",
    "download_trace",
    "find_trace",
    "known_names",
    "load_trace",
]

TRACE_DIR_ENV = "CBGYM_TRACE_DIR"
_DERIVED_CACHE: dict[str, tuple[list[Trace], Trace]] = {}
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0


class TraceNotFoundError(FileNotFoundError):
    """A named trace is on no searched path and could not be downloaded."""


class TraceChecksumError(ValueError):
    """A trace file's sha256 differs from the published one (corrupt or different file)."""


def default_cache_dir() -> Path:
    """The user trace cache: ``$XDG_CACHE_HOME/cbgym/traces`` or ``~/.cache/cbgym/traces``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "cbgym" / "traces"


def _env_dirs() -> list[Path]:
    value = os.environ.get(TRACE_DIR_ENV, "")
    return [Path(part).expanduser() for part in value.split(os.pathsep) if part]


def _search_dirs(cache_dir: str | Path | None) -> list[tuple[str, Path]]:
    places = [(f"${TRACE_DIR_ENV}", d) for d in _env_dirs()]
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return [*places, ("cache", cache)]


def find_trace(name: str, *, cache_dir: str | Path | None = None) -> Path | None:
    """Where the file of catalogue trace ``name`` is on disk, or None (nothing is downloaded).
    A derived trace: its first part's file, if every part is found."""
    if name in DERIVED:
        found = [find_trace(part, cache_dir=cache_dir) for part in DERIVED[name]]
        return found[0] if all(found) else None
    if name in LOCAL_TRACES:
        for _, directory in _search_dirs(cache_dir):
            for relative in LOCAL_TRACES[name].paths:
                candidate = directory / relative
                if candidate.exists():
                    return candidate
        return None
    entry = _entry(name)
    for _, directory in _search_dirs(cache_dir):
        candidate = directory / entry.filename
        if candidate.is_file():
            return candidate
    return None


def _entry(name: str) -> TraceEntry:
    if name not in CATALOG:
        raise ValueError(
            f"unknown trace name {name!r}; known names: {', '.join(known_names())} "
            "(or pass the path of an existing trace file)"
        )
    return CATALOG[name]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(entry: TraceEntry, source: str, actual: str, advice: str) -> None:
    if entry.sha256 is not None and actual != entry.sha256:
        raise TraceChecksumError(
            f"{source}: sha256 is {actual}, expected {entry.sha256} for {entry.name} "
            f"({entry.url}); {advice}"
        )


def download_trace(
    name: str, directory: str | Path | None = None, *, force: bool = False
) -> Path:
    """Download catalogue trace ``name`` into ``directory`` (default: the user cache).

    The file is streamed to a temporary file in the same directory, its sha256 checked (where
    one is pinned), and only then renamed into place, so an interrupted or corrupt download
    never leaves a file that looks complete.

    Args:
        name: a catalogue name such as ``"azure-conv-2023"``.
        directory: where to put the file; default :func:`default_cache_dir`.
        force: download even if the file is already there.

    Returns:
        The path of the downloaded file.

    Raises:
        TraceChecksumError: the downloaded bytes do not match the pinned sha256.
        OSError: the download failed (``urllib.error.URLError`` is a subclass).
    """
    entry = _entry(name)
    directory = Path(directory).expanduser() if directory is not None else default_cache_dir()
    target = directory / entry.filename
    if target.is_file() and not force:
        return target
    directory.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{entry.filename}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(handle, "wb") as out:
            digest = _stream(entry, out)
        _verify(entry, f"download of {entry.url}", digest,
                 "the download was corrupted or the published file changed; nothing was saved.")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _stream(entry: TraceEntry, out: Any) -> str:
    digest = hashlib.sha256()
    with urllib.request.urlopen(entry.url, timeout=_TIMEOUT_S) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=entry.filename) as bar:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    return digest.hexdigest()


def _not_found(entry: TraceEntry, cache_dir: str | Path | None, why: str) -> TraceNotFoundError:
    places = _search_dirs(cache_dir)
    looked = [f"  - {label}: {d / entry.filename}" for label, d in places]
    if not _env_dirs():
        looked.insert(0, f"  - ${TRACE_DIR_ENV}: not set")
    target = places[-1][1] / entry.filename
    return TraceNotFoundError(
        f"trace {entry.name!r} ({entry.filename}) not found. Looked in:\n" + "\n".join(looked)
        + f"\n{why}\nTo fix it, download {entry.url}\nand put it at {target}\n"
        f"(or in a directory named by ${TRACE_DIR_ENV}), e.g.\n"
        f"  curl -L --create-dirs -o '{target}' '{entry.url}'\n"
        f"or run: python traces/fetch.py {entry.name}"
    )


def _resolve_named(
    entry: TraceEntry, cache_dir: str | Path | None, download: bool
) -> Path:
    found = find_trace(entry.name, cache_dir=cache_dir)
    if found is not None:
        return found
    if not download:
        raise _not_found(entry, cache_dir, "Downloading is off (download=False).")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    try:
        return download_trace(entry.name, cache)
    except TraceChecksumError:
        raise
    except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, bad URL, disk
        raise _not_found(entry, cache_dir, f"Downloading {entry.url} failed: {exc}") from exc


@functools.lru_cache(maxsize=16)
def _load_cached(
    path: str, mtime_ns: int, size: int, name: str, options: tuple[tuple[str, Any], ...]
) -> Trace:
    # mtime_ns and size are only part of the key: a changed file is a cache miss.
    del mtime_ns, size
    entry = CATALOG.get(name)
    if entry is not None and entry.sha256 is not None:
        _verify(entry, path, _sha256(Path(path)),
                 "the file is corrupt or not the published one. Delete it to re-download, "
                 "or load it by path to skip the check.")
    trace = load_trace_file(path, **dict(options))
    return replace(trace, name=name) if name else trace


@functools.lru_cache(maxsize=4)
def _load_folder_cached(
    path: str, stamp: tuple[tuple[str, int, int], ...], name: str,
    options: tuple[tuple[str, Any], ...],
) -> Trace:
    del stamp  # only part of the key: a changed, added or removed file is a cache miss
    if any(Path(path).glob("chunk-*-trace.csv")):  # ServeGen clients, tiered
        if options:
            raise ValueError(f"load_trace: {path} is a folder of ServeGen clients, which "
                             f"takes no options (got {', '.join(k for k, _ in options)})")
        trace = servegen_tenants(path)
    else:
        trace = load_agent_sessions(path, **dict(options))
    return replace(trace, name=name) if name else trace


def _load_folder(path: Path, name: str, options: dict[str, Any]) -> Trace:
    resolved = path.resolve()
    stamp = tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size)
                  for f in sorted(resolved.iterdir())
                  if f.suffix in (".json", ".csv", ".gz"))
    return _load_folder_cached(str(resolved), stamp, name, tuple(sorted(options.items())))


def _local_not_found(entry: LocalTraceEntry, cache_dir: str | Path | None) -> TraceNotFoundError:
    places = _search_dirs(cache_dir)
    looked = [f"  - {label}: {d / rel}" for label, d in places for rel in entry.paths]
    if not _env_dirs():
        looked.insert(0, f"  - ${TRACE_DIR_ENV}: not set")
    return TraceNotFoundError(
        f"trace {entry.name!r} not found. Looked in:\n" + "\n".join(looked)
        + f"\ncbgym does not download it ({entry.source}); put it in a directory named by "
        f"${TRACE_DIR_ENV} as {entry.paths[0]}"
    )


@functools.lru_cache(maxsize=4)
def _synthetic(name: str) -> Trace:
    if name == "synthetic-sessions":
        return synthetic_sessions(name=name)
    kind = "conv" if name == "synthetic-conv" else "code"
    return replace(synthetic_trace(kind), name=name)


def load_trace(
    name_or_path: str | os.PathLike[str],
    *,
    cache_dir: str | Path | None = None,
    download: bool = True,
    **options: Any,
) -> Trace:
    """Load a trace by catalogue name or path, downloading public traces on first use.

    Resolution order: an existing file path; an existing folder (agent sessions,
    :func:`cbgym.workload.sessions.load_agent_sessions`, or ServeGen clients in SLO tiers,
    :func:`cbgym.workload.servegen.servegen_tenants`); ``synthetic-conv``/``synthetic-code``
    (generated, default size) or ``synthetic-sessions``
    (:func:`cbgym.workload.session_synth.synthetic_sessions`, defaults); a local name
    (:data:`LOCAL_TRACES`: ``mooncake-conversation``, ``mooncake-synthetic``,
    ``agent-sessions``, ``tenants-servegen-language``), looked for like a catalogue name but
    never downloaded; a derived name
    (``tenants-conv-code-2023``: azure-conv-2023 as an interactive tenant beside azure-code-2023
    as a batch tenant, :func:`cbgym.workload.tenants.conv_code_tenants`); a catalogue name,
    looked for in each ``$CBGYM_TRACE_DIR`` directory, then in ``cache_dir`` (default
    :func:`default_cache_dir`), then downloaded into that cache. Loaded traces are cached
    in-process (keyed by path, mtime and size); a :class:`Trace` is immutable, so callers share
    one object safely.

    Args:
        name_or_path: a name from :func:`known_names`, a trace file path, or a folder of
            agent-session files or of ServeGen client files.
        cache_dir: the download cache directory (replaces the user cache).
        download: whether a missing catalogue trace may be downloaded.
        **options: passed to the file loader (e.g. ``drop_zero_output=True``).

    Returns:
        The trace; named by its catalogue name, or by its path.

    Raises:
        TraceNotFoundError: the file is missing and could not be downloaded; the message lists
            every place looked, where to put the file, and its URL.
        TraceChecksumError: a catalogue file's sha256 does not match.
        ValueError: an unknown name (the message lists the known ones).
        TraceFormatError: the file is malformed.
    """
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        return _load_path(path, "", options)
    if path.is_dir():
        return _load_folder(path, "", options)
    if text in SYNTHETIC_NAMES:
        return _synthetic(text)
    if text in LOCAL_TRACES:
        found = find_trace(text, cache_dir=cache_dir)
        if found is None:
            raise _local_not_found(LOCAL_TRACES[text], cache_dir)
        return (_load_folder if found.is_dir() else _load_path)(found, text, options)
    if text in DERIVED:  # (each part found, cached or downloaded as a catalogue trace)
        from cbgym.workload.tenants import conv_code_tenants

        parts = [load_trace(p, cache_dir=cache_dir, download=download, **options)
                 for p in DERIVED[text]]
        held = _DERIVED_CACHE.get(text)  # (rebuilt only when a part was reloaded)
        if held is None or any(a is not b for a, b in zip(held[0], parts, strict=True)):
            held = (parts, replace(conv_code_tenants(*parts), name=text))
            _DERIVED_CACHE[text] = held
        return held[1]
    if not isinstance(name_or_path, str) or os.sep in text or path.suffix:
        raise TraceNotFoundError(
            f"no trace file at {path.resolve()} (and it is not a known trace name: "
            f"{', '.join(known_names())})"
        )
    return _load_path(_resolve_named(_entry(text), cache_dir, download), text, options)


def _load_path(path: Path, name: str, options: dict[str, Any]) -> Trace:
    resolved = path.resolve()
    stat = resolved.stat()
    # Options become part of the cache key, so make list-valued ones (a model list) hashable.
    key = tuple(
        sorted((k, tuple(v) if isinstance(v, list | set) else v) for k, v in options.items())
    )
    return _load_cached(str(resolved), stat.st_mtime_ns, stat.st_size, name, key)
