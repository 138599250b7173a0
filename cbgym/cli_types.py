"""The ``cbgym`` command's argument types: each parses one option's text or says, in one line,
what was expected (argparse turns an ``ArgumentTypeError`` into the parser's error)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def listed(convert: Callable[[str], Any], what: str) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        return tuple(convert(item) for item in items)

    return parse


def traces(text: str) -> tuple[str, ...]:
    """``--trace``'s list: comma-separated names or paths, where a path may itself hold
    commas (the longest run of parts that names an existing file is one trace)."""
    parts, out, i = text.split(","), [], 0
    while i < len(parts):
        j = next((j for j in range(len(parts), i + 1, -1)
                  if Path(",".join(parts[i:j]).strip()).expanduser().exists()), i + 1)
        item = ",".join(parts[i:j]).strip()
        if item:
            out.append(item)
        i = j
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of trace names or "
                                         "paths")
    return tuple(out)


def out_dir(parser: argparse.ArgumentParser, path: str) -> Path:
    """``--out DIR`` checked (and made) before any work, so a bad path never loses a run's
    results at its end."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        parser.error(f"--out: {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out: cannot create {out}: {exc.strerror or exc}")
    if not os.access(out, os.W_OK):
        parser.error(f"--out: {out} is not writable")
    return out


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def load(text: str) -> float:
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"load must be a number > 0 (offered load rho = lambda / mu), got {text!r}"
        ) from None


def load_or_recorded(text: str) -> float | str:
    """``cbgym simulate --load``: a load, or ``"recorded"`` (the trace's own arrival times)."""
    return "recorded" if text.strip().lower() == "recorded" else load(text)


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1), got {text}")
    return value


def span(text: str) -> tuple[float, float]:
    """``LO:HI``: a part of a trace as fractions of its requests, 0 <= LO < HI <= 1."""
    lo, colon, hi = text.partition(":")
    try:
        a, b = float(lo), float(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI (fractions, e.g. 0.4:1), got "
                                         f"{text!r}") from None
    if not (colon and 0 <= a < b <= 1):
        raise argparse.ArgumentTypeError(f"expected LO:HI with 0 <= LO < HI <= 1, got {text!r}")
    return (a, b)


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text}")
        return value

    return parse


def seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed {text!r} is not an integer") from None


def given(args: argparse.Namespace, parser: argparse.ArgumentParser, dest: str) -> bool:
    """Whether option ``dest`` was given a value other than its default (argparse passes a
    string default through the option's type)."""
    action = next(a for a in parser._actions if a.dest == dest)
    default = action.default
    if isinstance(default, str) and callable(action.type):
        default = action.type(default)
    return bool(getattr(args, dest) != default)
