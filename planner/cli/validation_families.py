"""Which recipe family a published figure belongs to, and which families are held out.

A *recipe family* is one publisher's series of runs made with one stack and one way of counting
(a paper's tables, one framework's docs and benchmark pages, one release line of NVIDIA's
performance summaries). ``planner validate --cross`` leaves one family out at a time, refits
every fitted constant without it and predicts it (``planner.cli.validation_cross``).

*Held out* sources are never fitted nor used to choose a constant (issue 23): their figures judge
the model from outside. ``tests/test_validation_sources.py`` fails if a ``source:`` in
``calibration/`` matches one of ``HELD_OUT``'s patterns.
"""
from __future__ import annotations

import re

# (family, pattern): matched case-insensitively on a source string (paper, URL, page, table)
HELD_OUT: tuple[tuple[str, str], ...] = (
    ("Megatron-Bridge performance summaries", r"megatron[-_ ]?bridge"),
    # a NeMo release of 2025 (25.01 .. 25.12, or "25.x") named near "NeMo"
    ("NeMo 25.x performance summaries", r"nemo[^\n]{0,80}\b25\.(0[1-9]|1[0-2]|x)\b|\b25\.(0[1-9]|1[0-2]|x)\b[^\n]{0,40}nemo"),
    ("NVIDIA dgxc-benchmarking", r"dgxc"),
    ("MosaicML llm-foundry benchmark tables", r"llm[-_ ]?foundry"),
    ("MegaScale paper", r"megascale|2402\.15627"),
    ("Nemotron-4 technical reports", r"nemotron[-_ ]?4|2402\.16819|2406\.11704"),
)

# (family, pattern), first match wins: the families --cross leaves out one at a time
FAMILIES: tuple[tuple[str, str], ...] = (
    ("mlperf", r"mlcommons|mlperf"),                # MLPerf Training submissions (before the NeMo/Megatron patterns)
    ("aleph-alpha", r"aleph-alpha|2311\.05610"),  # Hagemann et al.'s layout sweep (before megatron-lm)
    ("zero-bubble", r"2401\.10241|zero[- ]bubble"),  # Qi et al.'s Megatron 1F1B baselines (before megatron-lm)
    ("opt", r"2205\.01068|metaseq"),               # Meta's OPT-175B (before megatron-lm, whose layers it ran)
    ("fp8-lm", r"2310\.18313|fp8-lm|ms-amp"),     # Microsoft's FP8-LM Table 5 baselines (before megatron-lm)
    ("megatron-llama", r"megatron-llama"),          # Alibaba's Megatron-LM fork's README (before megatron-lm)
    # Pai-Megatron-Patch runs on Megatron-LM: XTuner's Megatron MoE benchmark guide (before megatron-lm)
    ("pai-megatron", r"pai-megatron-patch|internlm/xtuner"),
    ("megatron-kwai", r"kwai/megatron-kwai"),       # Kuaishou's ATC'24 artifact: stock Megatron-LM and its fork (H800)
    ("skywork", r"2310\.19341|skywork"),            # Kunlun's Skywork-13B layout table (Megatron-LM; before megatron-lm)
    ("fujii-4d", r"okoge-kaz/megatron-lm|2411\.06465"),  # Fujii's Megatron-LM 4D sweep in his fork (before megatron-lm)
    ("glm-130b", r"2210\.02414|thudm/glm-130b"),    # Tsinghua's GLM-130B (DeepSpeed pipeline + Megatron TP)
    ("internlm", r"internlm/intern(lm|evo)"),      # InternLM's training-performance tables (before flashattention)
    ("flagperf", r"flagopen/flagperf"),             # BAAI's FlagPerf benchmark READMEs (PaddlePaddle runs)
    ("ml-engineering", r"stas00/ml-engineering"),   # Stas Bekman's ml-engineering benchmarks (DeepSpeed, HF)
    ("jax-toolbox", r"nvidia/jax-toolbox"),          # NVIDIA's JAX-Toolbox tables: Pax and MaxText (before maxtext)
    ("maxtext", r"maxtext"),                         # MaxText's A3 table and gpu-recipes' MaxText logs (before gpu-recipes)
    ("gpu-recipes", r"ai-hypercomputer/gpu-recipes"),  # Google Cloud's own NeMo 1.0 logs (A4, A3 Mega, A3 Ultra)
    ("megatron-papers", r"narayanan|korthikanti"),
    # NVIDIA's Megatron Core MoE report (its configs are the ModelZoo's; before megatron-moe-modelzoo)
    ("mcore-moe-report", r"2603\.07685"),
    ("megatron-moe-modelzoo", r"megatron-moe-modelzoo"),
    ("moe-folding", r"2504\.14960"),               # NVIDIA's MoE Parallel Folding paper (Megatron-Core; before megatron-lm)
    ("megatron-readme", r"megatron-lm"),            # the README's 2024 scaling tables, the MoE README
    ("nemo-24", r"nemo\b.*24\.0\d|nvidia/nemo|nemo performance summary"),
    ("lightning-thunder", r"lightning-ai/lightning-thunder"),  # Thunder's litgpt benchmark PRs (PyTorch FSDP2)
    ("aws-torchtitan", r"amazon sagemaker|sagemaker-distributed-training-workshop"),  # AWS and Meta's torchtitan runs
    ("pytorch-float8", r"training-using-float8-fsdp2"),  # IBM and Meta's float8 + FSDP2 post (torchtitan runs)
    ("nebius-torchtitan", r"nebius/ml-cookbook"), # PyTorch and Nebius's DeepSeek-V3 post (torchtitan MoE; before torchtitan)
    ("torchtitan-prs", r"torchtitan pr #"),          # figures in torchtitan's pull requests (before torchtitan)
    ("torchtitan", r"torchtitan"),
    ("bigscience", r"bigscience"),
    ("mt-nlg", r"megatron-turing|mt-nlg|2201\.11990"),
    ("gpt-neox", r"gpt-neox"),
    ("llama3", r"llama 3 herd|2407\.21783"),
    ("accelerate", r"accelerate"),
    ("deepseek", r"deepseek"),
    ("flashattention", r"flash-?attention|2307\.08691"),
    ("ibm-fsdp", r"maximizing-training|fms-fsdp"),  # the PyTorch/IBM FSDP blog posts
    ("olmo-core", r"olmo-core"),
    ("kempnerforge", r"kempnerforge"),               # the Kempner Institute's KempnerForge benchmark campaigns (H200)
    ("tinyllama", r"tinyllama"),
    ("bloomberggpt", r"bloomberggpt|2303\.17564"),
    ("smollm", r"huggingface/smollm|nanotron"),     # Hugging Face's SmolLM pretraining (nanotron)
)


def held_out_family(text: str) -> str | None:
    """The held-out family a source string names, or None."""
    for fam, pat in HELD_OUT:
        if re.search(pat, text, re.IGNORECASE):
            return fam
    return None


def family_of(source: str) -> str:
    """The recipe family of a case's ``source`` ("other" when none matches)."""
    for fam, pat in FAMILIES:
        if re.search(pat, source, re.IGNORECASE):
            return fam
    return "other"


def scale_bucket(num_gpus: int) -> str:
    """The scale a run is reported under: 1-64, 65-512, 513-4096, more than 4096 GPUs."""
    for top, name in ((64, "<=64 GPUs"), (512, "65-512"), (4096, "513-4096")):
        if num_gpus <= top:
            return name
    return ">4096"


def generation(gpu_name: str) -> str:
    """The GPU generation of a catalog GPU name (A100, H100, H200, B200, ...)."""
    m = re.match(r"(GB\d00|[A-Z]+\d+[A-Z]?)", gpu_name)
    return m.group(1) if m else gpu_name
