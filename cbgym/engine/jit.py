"""How cbgym compiles its kernels: numba, cached on disk, announced once per machine.

Every engine and env kernel is a plain Python function decorated with :func:`kernel`. With
``NUMBA_DISABLE_JIT=1`` in the environment numba leaves them uncompiled, so the whole engine
runs as ordinary Python: breakpoints, ``print`` and coverage work inside the scheduling loop
(about a hundred times slower; for debugging, never for experiments).

Compiled code is cached by numba next to the modules, or, when the package folder is not
writable (a system-wide install), in the user's cache folder (numba's user-wide locator), or
wherever ``NUMBA_CACHE_DIR`` points. The first use on a machine compiles; :func:`bind` prints
one line on stderr when it has to, so a researcher knows why the first step takes seconds.

NOTE on stale caches: numba checks a cached kernel against its own source file only, so an
edit to a function it calls (inlined into its machine code) in another file would go
unnoticed and the old code would keep running. :func:`drop_stale` therefore stamps each cache
folder with a hash of every kernel module and every cbgym module they import (constants are
frozen into the code too), and empties the folder's kernel files when the stamp changes.
(A process started on older sources that compiles a new specialisation after the stamp
changed can still store it there: restart long runs after editing kernels.)

NOTE on literals: numba compiles a kernel once per *literal* value a Python int argument
takes (``f(s, 0)`` and ``f(s, n)`` are two compilations), and once per literal ``True`` or
``False``. The kernels' constants are numpy ints and bools (``cbgym.engine.layout``: ``YES``
and ``NO`` for flags) and counters that flow into calls start as ``np.int64(0)``.

NOTE on read-only arrays: numba types a read-only array apart from a writable one, so a
trace column that reaches a kernel read-only in one run (a loaded trace) and writable in
another (an unpickled env, a slice copy) compiles every kernel above it twice. Columns enter
the kernels through :func:`frozen`, read-only always.

NOTE on speed: the engine's kernels allocate no arrays (scratch lives in the state), so they
are compiled without reference counting (:func:`no_alloc_kernel`); the env's kernels, which
return fresh observation arrays, keep it.

NOTE on inlining: numba passes a tuple of arrays (the engine's ``State``, about 110 machine
words) by value, copied onto the stack at every call LLVM does not inline. Leaves called per
request take the rows they need instead, and a few phases called once per iteration or
step are inlined by numba itself (:func:`inline_kernel`; measured 5% more steps/s on the
vector env; the vector kernels' first compile took 49 s instead of 45 s). Measured
2026-12-05: one such call per request and iteration (``retire`` to ``finished``) took 16%
of the vector env's time.

NOTE on compile time: numba optimises each function together with everything it calls, so
the cost grows with the depth of the call graph, not with the number of functions. The
kernels keep it shallow: entry points call a few phases, phases call small leaves.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np

_BOUND: dict[tuple, Any] = {}
_ANNOUNCED = False
COLD_START_HINT_S = 40  # what the notice promises on a 2-core machine (bench_cold_start.py)
VECTOR_HINT_S = 50  # the batched kernels of cbgym.env.vector_ops (parallel: slower to build)
PACKAGE = Path(__file__).resolve().parents[1]
STAMP_FILE = "cbgym-kernels.stamp"
_DEFINES_KERNEL = re.compile(r"^@(no_alloc_|parallel_|inline_|no_alloc_inline_)?kernel$", re.M)
_IMPORTS = re.compile(r"^from (cbgym(?:\.\w+)*) import \(?([\w ,\n]+)\)?|^import (cbgym[\w.]*)",
                      re.M)
_CHECKED: set[str] = set()


def frozen(a: Any, dtype: type) -> np.ndarray:
    """``a`` as a contiguous read-only array of ``dtype`` (a view where no copy is needed)."""
    view = np.ascontiguousarray(a, dtype=dtype).view()
    view.flags.writeable = False
    return view


def kernel(fn: Callable) -> Any:
    """Compile ``fn`` with numba (nopython, cached on disk)."""
    return _fresh(numba.njit(cache=True, nogil=True)(fn))


def no_alloc_kernel(fn: Callable) -> Any:
    """:func:`kernel` for a function that allocates no array: compiled without numba's
    reference counting, whose atomic increments on every array view otherwise dominate the
    per-iteration path (measured: 60% of an engine run)."""
    return _fresh(numba.njit(cache=True, nogil=True, _nrt=False)(fn))


def inline_kernel(fn: Callable) -> Any:
    """:func:`kernel` that numba inlines into every kernel calling it (``inline="always"``):
    for a phase run once per step or iteration that takes the whole state (see the note on
    inlining above)."""
    return _fresh(numba.njit(cache=True, nogil=True, inline="always")(fn))


def no_alloc_inline_kernel(fn: Callable) -> Any:
    """:func:`no_alloc_kernel` inlined as :func:`inline_kernel` is."""
    return _fresh(numba.njit(cache=True, nogil=True, _nrt=False, inline="always")(fn))


def parallel_kernel(fn: Callable) -> Any:
    """:func:`kernel` whose ``numba.prange`` loops run on numba's threads (a batch of envs:
    each iteration touches only its own env's rows, so results do not depend on threads)."""
    return _fresh(numba.njit(cache=True, nogil=True, parallel=True)(fn))


def kernel_sources(package: Path = PACKAGE) -> list[Path]:
    """The files compiled kernels are made of: every module that defines a kernel and every
    cbgym module such a module imports."""
    files = set()
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if _DEFINES_KERNEL.search(text):
            files.add(path)
            for base, names, plain in _IMPORTS.findall(text):
                # "from cbgym.a import b": cbgym/a.py or cbgym/a/__init__.py, and
                # cbgym/a/b.py when b is a module; "import cbgym.a.b": that module
                mods = [plain] if plain else [base] + [
                    f"{base}.{name.split()[0]}" for name in names.split(",") if name.strip()]
                for mod in mods:
                    dep = package.parent.joinpath(*mod.split("."))
                    files.update(p for p in (dep.with_suffix(".py"), dep / "__init__.py")
                                 if p.is_file())
    return sorted(files)


@functools.lru_cache(maxsize=1)
def sources_stamp() -> str:
    """A hash of :func:`kernel_sources`: their names and contents."""
    h = hashlib.sha256()
    for path in kernel_sources():
        h.update(str(path.relative_to(PACKAGE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def drop_stale(folder: Path, stamp: str) -> int:
    """Delete numba's cache files in ``folder`` unless it carries ``stamp``, then stamp it;
    the number of files deleted. A folder that cannot be written is left alone (numba then
    does not cache there either)."""
    marker = folder / STAMP_FILE
    try:
        if marker.read_text() == stamp:
            return 0
    except OSError:
        pass
    deleted = 0
    try:
        for path in folder.glob("*.nb[ic]"):
            path.unlink(missing_ok=True)
            deleted += 1
        marker.write_text(stamp)
    except OSError:
        pass
    return deleted


def _fresh(dispatcher: Any) -> Any:
    """Check ``dispatcher``'s cache folder against the kernels' sources (once per folder)."""
    cache = getattr(dispatcher, "_cache", None)  # none with NUMBA_DISABLE_JIT=1
    folder = getattr(cache, "cache_path", None)
    if folder and folder not in _CHECKED:
        _CHECKED.add(folder)
        drop_stale(Path(folder), sources_stamp())
    return dispatcher


def _layout(x: object) -> object:
    """What numba's type of ``x`` depends on, cheaply (arrays: dtype, ndim, flags)."""
    if isinstance(x, np.ndarray):
        f = x.flags
        return x.dtype.str, x.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned
    if isinstance(x, tuple):
        return type(x), tuple(_layout(v) for v in x)
    return type(x)


def _announce(fn: Any) -> None:
    global _ANNOUNCED
    if _ANNOUNCED:
        return
    _ANNOUNCED = True
    where = getattr(getattr(fn, "_cache", None), "cache_path", None) or "numba's cache"
    print(f"cbgym: compiling the engine kernels for this machine (once: about "
          f"{COLD_START_HINT_S} s on 2 cores, {VECTOR_HINT_S} s more for a vector env; cached "
          f"in {where})", file=sys.stderr, flush=True)


def bind(fn: Any, *args: object) -> Callable:
    """``fn``'s compiled entry point for arguments of exactly these types.

    Calling it skips numba's per-call type dispatch (several microseconds for the state
    tuples, more than an engine iteration). Valid only for arguments of the same types: the
    state arrays are always built C-contiguous and writeable (``layout.new_state``), so a
    state rebuilt after unpickling binds to the same compiled code, never to a new one.
    """
    if not isinstance(fn, numba.core.registry.CPUDispatcher):  # NUMBA_DISABLE_JIT=1
        return fn
    key = (fn, _layout(args))
    entry = _BOUND.get(key)
    if entry is None:
        sig = tuple(numba.typeof(x) for x in args)
        if sig not in fn.overloads:
            cache = getattr(fn, "_cache", None)
            cached = cache.load_overload(sig, fn.targetctx) if cache is not None else None
            if cached is None:
                _announce(fn)
        fn.compile(sig)  # loads from the on-disk cache when it can
        entry = _BOUND[key] = fn.overloads[sig].entry_point
    return entry
