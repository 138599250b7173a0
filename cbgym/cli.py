"""The ``cbgym`` console command.

Subcommands:

* ``cbgym bench``: sweep policies x loads x traces x engines x windows x seeds, print the study's
  table, optionally write CSVs, ``config.json`` and plots (``--out``). With no options it is a
  short benchmark (seconds) of FCFS, CB-SJF-Work and Oracle-Work at rho = 0.9.
* ``cbgym simulate``: one run (one policy, one window, one load), printing its summary; any
  row of a bench's ``results.csv`` can be re-run with it.

Bad options print one line, ``cbgym <command>: error: ...``, on stderr and exit with status 2.
This module is the entry point and the options the subcommands share; each subcommand lives in
its own module: :mod:`cbgym.cli_bench`, :mod:`cbgym.cli_simulate`, :mod:`cbgym.tasks.cli`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from cbgym import cli_types as T

DEFAULT_TRACE = "azure-conv-2023"
FALLBACK_TRACE = "synthetic-conv"
DEFAULT_LOADS = "0.9"
DEFAULT_ENGINE = "cbsjf-paper"


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a single line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(str(message).split())  # one line, whatever the message held
        self.exit(2, f"{self.prog}: error: {text}\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
    """Defaults in the help text (unless None/False or already said), descriptions as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


# ---------------------------------------------------------------- shared options


def _add_engine_options(parser: argparse.ArgumentParser, plural: bool) -> None:
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--engine", default=DEFAULT_ENGINE, metavar="PRESET" + ("[,PRESET...]" if plural else ""),
        help="engine preset: 'cbsjf-paper' (the study's engine: separate prefill/decode "
             "iterations, no chunking, no preemption) or a roofline preset 'model/gpu[/tpN]', "
             "e.g. 'llama-2-13b/a100-80gb' (vLLM-style chunked prefill and preemption)"
             + ("; comma-separated for several" if plural else ""))
    group.add_argument("--max-num-seqs", type=T.int_at_least(1), default=None, metavar="N",
                       help="override the cap on running requests (vLLM max_num_seqs)")
    group.add_argument("--max-num-batched-tokens", type=T.int_at_least(1), default=None,
                       metavar="N", help="override the per-iteration token budget")
    group.add_argument("--preemption", choices=("recompute", "swap"), default=None,
                       help="override what happens to a preempted request's KV")
    group.add_argument("--no-chunked-prefill", action="store_true",
                       help="turn chunked prefill off (roofline presets)")
    group.add_argument("--prefix-caching", action="store_true",
                       help="vLLM's automatic prefix caching, on traces with block ids "
                            "(mooncake-*, agent-sessions; docs/prefix-caching.md)")


def _add_slo_options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("metrics")
    group.add_argument("--ttft", type=T.positive_float, default=2.0, metavar="S",
                       help="TTFT SLO in seconds (goodput counts requests meeting both SLOs)")
    group.add_argument("--tpot", type=T.positive_float, default=0.1, metavar="S",
                       help="TPOT SLO in seconds per output token")
    group.add_argument("--warmup", type=T.fraction, default=0.1, metavar="FRAC",
                       help="fraction of each window's earliest requests left out of latency "
                            "statistics (the study discards 10%%)")
    return group


def _engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    from cbgym.bench import engine_overrides

    return engine_overrides(args.max_num_seqs, args.max_num_batched_tokens, args.preemption,
                            not args.no_chunked_prefill, args.prefix_caching)


def _default_trace(download: bool) -> tuple[str, str]:
    """The default trace and a sentence saying why it was chosen."""
    from cbgym.workload.catalog import find_trace

    found = find_trace(DEFAULT_TRACE)
    if found is not None:
        return DEFAULT_TRACE, f"trace: {DEFAULT_TRACE} (found at {found})"
    if download:
        return DEFAULT_TRACE, f"trace: {DEFAULT_TRACE} (downloading: --download)"
    return FALLBACK_TRACE, (
        f"trace: {FALLBACK_TRACE} (offline synthetic workload: {DEFAULT_TRACE} was not found "
        "locally; set CBGYM_TRACE_DIR or pass --download to use it)")


def _or_fail(parser: argparse.ArgumentParser, option: str, call: Callable[[], Any]) -> Any:
    """``call()``, turning a ValueError into the parser's one-line error for ``option``."""
    try:
        return call()
    except ValueError as exc:
        parser.error(f"{option}: {exc}")


# ---------------------------------------------------------------- entry point


def build_parser() -> OneLineParser:
    """The ``cbgym`` argument parser with its subcommands."""
    parser = OneLineParser(prog="cbgym", description="cbgym: LLM-serving scheduler simulator.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from cbgym.cli_bench import add_parser as bench_parser

    bench_parser(sub)
    from cbgym.cli_simulate import add_parser as simulate_parser

    simulate_parser(sub)
    from cbgym.tasks.cli import add_parser as evaluate_parser

    evaluate_parser(sub, _HelpFormatter)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``cbgym`` command; returns the exit status (errors raise SystemExit(2))."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("choose a command: bench, simulate or evaluate (see cbgym --help)")
    try:
        return int(args.handler(args, args.subparser))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
