"""Download public traces by catalogue name.

    python traces/fetch.py azure-conv-2023 [azure-code-2023 ...] [--dir D] [--force]

Without ``--dir`` files go to the user cache (``$XDG_CACHE_HOME/cbgym/traces``, by default
``~/.cache/cbgym/traces``), where ``cbgym.workload.load_trace`` finds them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from cbgym.workload.catalog import CATALOG, download_trace
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from cbgym.workload.catalog import CATALOG, download_trace


def main(argv: list[str] | None = None) -> int:
    """Download each named trace; returns the process exit status."""
    parser = argparse.ArgumentParser(description="Download public LLM request traces.")
    parser.add_argument("names", nargs="+", choices=sorted(CATALOG), metavar="NAME",
                        help=f"one of: {', '.join(CATALOG)}")
    parser.add_argument("--dir", type=Path, default=None,
                        help="directory to download into (default: the user cache)")
    parser.add_argument("--force", action="store_true", help="download even if present")
    args = parser.parse_args(argv)
    for name in args.names:
        entry = CATALOG[name]
        try:
            path = download_trace(name, args.dir, force=args.force)
        except (OSError, ValueError) as exc:  # network/disk failure, checksum mismatch
            print(f"{name}: download from {entry.url} failed: {exc}", file=sys.stderr)
            return 1
        check = "sha256 verified" if entry.sha256 else "no pinned sha256"
        print(f"{name}: {path} ({check})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
