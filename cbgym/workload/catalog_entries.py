"""The trace catalogue: every name :func:`cbgym.workload.catalog.load_trace` accepts, with the
public URL, sha256 and citation of each downloadable file and where each local-only trace lies.
Plain data; :mod:`cbgym.workload.catalog` finds, downloads and loads the traces it names."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CATALOG",
    "DERIVED",
    "LOCAL_TRACES",
    "SYNTHETIC_NAMES",
    "LocalTraceEntry",
    "TraceEntry",
    "known_names",
]

SYNTHETIC_NAMES = ("synthetic-conv", "synthetic-code", "synthetic-sessions")
# traces built from catalogue traces: name -> (its parts, how they are combined)
DERIVED = {"tenants-conv-code-2023": ("azure-conv-2023", "azure-code-2023")}
_SPLITWISE = (
    "Patel et al., 'Splitwise: Efficient generative LLM inference using phase splitting', "
    "ISCA 2024"
)
_DYNAMOLLM = (
    "Stojkovic et al., 'DynamoLLM: Designing LLM Inference Clusters for Performance and "
    "Energy Efficiency', HPCA 2025 (arXiv:2408.00741)"
)
_GITHUB = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
_BLOB = "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/"


@dataclass(frozen=True)
class TraceEntry:
    """A public trace file that :func:`load_trace` knows by name.

    Attributes:
        name: catalogue name, e.g. ``"azure-conv-2023"``.
        filename: the public file name (what to put in ``$CBGYM_TRACE_DIR``).
        url: where to download it.
        sha256: hex digest of the file, or None where none is pinned (not verified).
        rows: number of requests.
        span_s: time from first to last request, seconds (approximate for 2024).
        citation: the paper to cite when publishing results.
        licence: SPDX-style licence id.
    """

    name: str
    filename: str
    url: str
    sha256: str | None
    rows: int
    span_s: float
    citation: str
    licence: str = "CC-BY-4.0"


CATALOG: dict[str, TraceEntry] = {
    entry.name: entry
    for entry in (
        TraceEntry(
            "azure-conv-2023", "AzureLLMInferenceTrace_conv.csv",
            _GITHUB + "AzureLLMInferenceTrace_conv.csv",
            "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
            19_366, 3501.7, _SPLITWISE,
        ),
        TraceEntry(
            "azure-code-2023", "AzureLLMInferenceTrace_code.csv",
            _GITHUB + "AzureLLMInferenceTrace_code.csv",
            "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
            8_819, 3435.9, _SPLITWISE,
        ),
        # The 2024 week-long files (~1.1 GB conv, ~0.7 GB code) have no published checksum and
        # we hold no copy to compute one, so they are not verified.
        TraceEntry(
            "azure-conv-2024", "AzureLLMInferenceTrace_conv_1week.csv",
            _BLOB + "AzureLLMInferenceTrace_conv_1week.csv", None,
            27_303_999, 604_800.0, _DYNAMOLLM,
        ),
        TraceEntry(
            "azure-code-2024", "AzureLLMInferenceTrace_code_1week.csv",
            _BLOB + "AzureLLMInferenceTrace_code_1week.csv", None,
            16_803_695, 604_800.0, _DYNAMOLLM,
        ),
    )
}


@dataclass(frozen=True)
class LocalTraceEntry:
    """A trace :func:`load_trace` knows by name but does not download (no pinned public file).

    Attributes:
        name: catalogue name, e.g. ``"mooncake-conversation"``.
        paths: where it may lie, relative to a trace directory, in order of preference (a file,
            a folder of agent-session files, or a folder of ServeGen client files).
        rows: number of requests.
        source: where the data were published.
        licence: SPDX-style licence id.
    """

    name: str
    paths: tuple[str, ...]
    rows: int
    source: str
    licence: str = "Apache-2.0"


_SERVEGEN = ("ServeGen (Xiang et al., 'ServeGen: Workload Characterization of Large Language "
             "Model Serving in Production', arXiv:2505.09999), https://github.com/alibaba/ServeGen")
_MOONCAKE = "Mooncake FAST'25 release, https://github.com/kvcache-ai/Mooncake"
LOCAL_TRACES: dict[str, LocalTraceEntry] = {
    entry.name: entry
    for entry in (
        LocalTraceEntry("mooncake-conversation",
                        ("mooncake/conversation_trace.jsonl", "conversation_trace.jsonl"),
                        12_031, _MOONCAKE),
        LocalTraceEntry("mooncake-synthetic",
                        ("mooncake/synthetic_trace.jsonl", "synthetic_trace.jsonl"),
                        3_993, _MOONCAKE),
        LocalTraceEntry("agent-sessions", ("agent-sessions",), 996,
                        "40 of the kv-cache-tester project's agent session traces"),
        # (a folder of client descriptions: the trace is drawn from them, seed 0,
        # cbgym.workload.servegen.servegen_tenants)
        LocalTraceEntry("tenants-servegen-language", ("servegen/language/m-small",), 266_914,
                        _SERVEGEN),
    )
}


def known_names() -> list[str]:
    """Every name :func:`load_trace` accepts (catalogue, local, synthetic and derived)."""
    return [*CATALOG, *LOCAL_TRACES, *SYNTHETIC_NAMES, *DERIVED]
