"""No published figure in ``calibration/`` comes from a held-out source (issue 23).

Held out, never fitted nor used to choose a constant: the Megatron-Bridge performance summaries
(any version), the NeMo 25.x performance summaries, NVIDIA dgxc-benchmarking, the MosaicML
llm-foundry benchmark tables, the MegaScale paper and the Nemotron-4 technical reports. The patterns
(``planner.cli.validation_families.HELD_OUT``) are matched on every ``source:`` and ``url:`` value of
every case in every calibration file, whoever owns the file.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.cli.validation_families import HELD_OUT, family_of, held_out_family

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "calibration").glob("*.yaml"))


def _sources(node, where: str):
    """Every (where, text) of a ``source``/``url`` key anywhere in a YAML document."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("source", "url", "sources") and isinstance(v, (str, list)):
                for s in (v if isinstance(v, list) else [v]):
                    yield where, str(s)
            else:
                yield from _sources(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            name = v.get("name", i) if isinstance(v, dict) else i
            yield from _sources(v, f"{where}[{name}]")


def test_calibration_files_exist():
    assert len(FILES) >= 5


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_source_is_held_out(path):
    data = yaml.safe_load(path.read_text())
    bad = [f"{w}: {s!r} ({held_out_family(s)})" for w, s in _sources(data, path.name) if held_out_family(s)]
    assert not bad, "held-out sources in calibration/:\n" + "\n".join(bad)


@pytest.mark.parametrize("text,family", [
    ("NVIDIA Megatron-Bridge performance summary 25.11, DGX-B200", "Megatron-Bridge performance summaries"),
    ("https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary.html", "Megatron-Bridge performance summaries"),
    ("NVIDIA NeMo performance summary, NeMo 25.04 container", "NeMo 25.x performance summaries"),
    ("NeMo Framework 25.09 performance_summary.md", "NeMo 25.x performance summaries"),
    ("the NeMo 25.x performance summary", "NeMo 25.x performance summaries"),
    ("NVIDIA/dgxc-benchmarking llama3.1 70B recipe", "NVIDIA dgxc-benchmarking"),
    ("mosaicml/llm-foundry scripts/train/benchmarking/README.md", "MosaicML llm-foundry benchmark tables"),
    ("Jiang et al., MegaScale: Scaling LLM Training to More Than 10,000 GPUs, NSDI'24", "MegaScale paper"),
    ("arXiv 2402.15627, Table 2", "MegaScale paper"),
    ("Nemotron-4 15B Technical Report, Sec. 2", "Nemotron-4 technical reports"),
    ("arXiv:2406.11704", "Nemotron-4 technical reports"),
])
def test_patterns_catch_every_held_out_family(text, family):
    """The check could fail: each held-out family's usual spellings are caught."""
    assert held_out_family(text) == family


@pytest.mark.parametrize("text", [
    "NVIDIA NeMo performance summary (docs/source/performance/performance_summary.md), NeMo 24.07 container",
    "NVIDIA/NeMo docs/source/performance/performance_long_sequence.md (added 2024-10-18)",
    "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md",
    "Narayanan et al. SC'21, Table 1",
    "NVIDIA/Megatron-LM README, 'Training Speed and Scalability' (commit f2e5db402c, 2024-07-15)",
    "NVIDIA NeMo performance summary, NeMo 24.07 container: 25.15 TFLOP/s per GPU",
])
def test_allowed_sources_pass(text):
    assert held_out_family(text) is None


def test_every_pattern_is_listed_with_its_family():
    assert {f for f, _ in HELD_OUT} == {
        "Megatron-Bridge performance summaries", "NeMo 25.x performance summaries", "NVIDIA dgxc-benchmarking",
        "MosaicML llm-foundry benchmark tables", "MegaScale paper", "Nemotron-4 technical reports"}


def test_every_training_case_has_a_recipe_family():
    """--cross leaves out one family at a time: each case must belong to a named one."""
    unknown = []
    for path in FILES:
        if "inference" in path.name:
            continue
        data = yaml.safe_load(path.read_text()) or {}
        for c in data.get("cases", []):
            if family_of(str(c.get("source", ""))) == "other":
                unknown.append(f"{path.name}:{c.get('name')}: {c.get('source')!r}")
    assert not unknown, "cases with no recipe family (add a pattern to validation_families.FAMILIES):\n" + "\n".join(unknown)
