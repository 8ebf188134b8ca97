"""torchao's low-precision gains on torchtitan, priced against what torchao published (stop 49).

torchao's MX formats README (pytorch/ao at 74c6d3df4, ``torchao/prototype/mx_formats/README.md``, "Training
e2e benchmarks on NVIDIA B200"; repeated in torchtitan's ``components/quantization/mxfp8.md``) trains Llama 3 8B
with torchtitan (6fc499f6, ``llama3_8b.toml``: FSDP2 over one host of 8 B200, local batch 1, sequence 8192,
per-op selective AC, torch.compile) in BF16, torchao Float8 (tensorwise with the FP8 all-gather; rowwise) and
torchao MXFP8, on "power limited" B200s whose limit it does not state. The absolute figures are not filed
as validation rows: the catalog's B200 runs at its datasheet power, and the unstated cap would read as a
model error (the model prices these runs about 1.85x the published tokens/s). What does not depend on the
cap is each recipe's gain over BF16 on the same GPUs, which this script prints beside the model's, each
configuration priced through the torchtitan target as ``planner validate`` prices a torchtitan run.

    .venv/bin/python bench/torchao_mx_ratios.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from costmodel.frameworks import FRAMEWORKS  # noqa: E402
from costmodel.training import estimate  # noqa: E402
from planner.cli import validation as V  # noqa: E402
from planner.plan import targets as T  # noqa: E402

# published median tokens/s per GPU (the README's table)
PUBLISHED = {"bf16": 8307.5, "float8 tensorwise (FP8 all-gather)": 10417.0, "float8 rowwise": 8640.5,
             "mxfp8_cublas": 9969.0, "mxfp8_cublas_rceil": 9642.0}
SETTINGS = {"bf16": {}, "float8 tensorwise (FP8 all-gather)": dict(dtype="fp8", fp8_recipe="tensorwise",
                                                                    fp8_param_gather=True),
            "float8 rowwise": dict(dtype="fp8", fp8_recipe="rowwise"), "mxfp8_cublas": dict(dtype="fp8", fp8_recipe="mxfp8"),
            "mxfp8_cublas_rceil": dict(dtype="fp8", fp8_recipe="mxfp8")}
BASE = dict(name="torchao-mx-llama3-8b-b200", framework="torchtitan", source="pytorch/ao mx_formats README",
            model=dict(catalog="llama-3-8b", seq_len=8192), cluster="dgx-b200", num_gpus=8, global_batch=8,
            parallel=dict(tp=1, pp=1, dp=8, zero=3, micro_batch=1, recompute="selective"),
            execution=dict(compile=True), precision="", dtype="bf16", reported=dict(tokens_per_s_per_gpu=1.0))


def priced(settings: dict) -> float:
    model, cluster, wl, par, prof, fw = V.case_inputs({**BASE, **settings})
    via, stages, why = V.target_for(fw, model, cluster, wl, par, None)
    if not via:
        raise SystemExit(f"the torchtitan target refuses it: {why}")
    rec = T.record(via)
    prof = V._with_overrides(prof, FRAMEWORKS.get(rec.table.for_config(par).runs, FRAMEWORKS[rec.profile]))
    return estimate(model, cluster, wl, par, stages=stages, framework=prof).tokens_per_s_per_gpu


def main() -> None:
    got = {k: priced(s) for k, s in SETTINGS.items()}
    print(f"{'recipe':36s} {'published':>10s} {'gain':>6s} {'model':>9s} {'gain':>6s}")
    for k in SETTINGS:
        print(f"{k:36s} {PUBLISHED[k]:10.1f} {PUBLISHED[k] / PUBLISHED['bf16']:6.3f} {got[k]:9.0f} "
              f"{got[k] / got['bf16']:6.3f}")


if __name__ == "__main__":
    main()
