"""The planner's free choice on the SC'21 A100 problems (issue 23's third check).

For each problem of Narayanan et al., SC'21, Table 1 (the shapes, GPU counts and global batches
of the ``megatron-sc21-*`` records in ``calibration/published_runs.yaml`` and
``calibration/holdout_runs.yaml``), and for the issue's command (gpt3-175b on 384 GPUs, batch 1536)
and gpt3-175b on 1,536 GPUs, runs

    planner plan --model FILE --cluster dgx-a100-80gb --seq-len 2048 --dtype fp16 --max-time 60
                 --gpus G --global-batch B --json

with a model file of that shape (GPT as the validation prices it: GELU, LayerNorm, learned
positions, tied embeddings, biases, dropout), and prints each best plan's MFU and layout.
The layout is free: nothing but the problem is fixed. Runs in a few minutes.

    .venv/bin/python bench/sc21_free_choice.py [--json OUT] [--only SUBSTRING]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PLANNER = str(Path(sys.executable).with_name("planner"))
RECORDS = ("calibration/published_runs.yaml", "calibration/holdout_runs.yaml")


def problems() -> list[dict]:
    """SC'21 Table 1's problems from the records, smallest first, then the issue's gpt3-175b cases."""
    from planner.cli.validation import _model

    found: dict[str, dict] = {}
    for rel in RECORDS:
        for case in yaml.safe_load((ROOT / rel).read_text())["cases"]:
            if not case["name"].startswith("megatron-sc21-gpt-"):
                continue
            spec = _model(case["model"], case["name"])
            found[case["name"]] = dict(name=case["name"].removeprefix("megatron-sc21-"), model=spec.to_dict(),
                                       gpus=case["num_gpus"], batch=case["global_batch"])
    out = sorted(found.values(), key=lambda p: p["gpus"])
    out.append(dict(name="gpt3-175b (issue)", model="gpt3-175b", gpus=384, batch=1536))
    out.append(dict(name="gpt3-175b", model="gpt3-175b", gpus=1536, batch=1536))
    return out


def layout(par: dict) -> str:
    parts = [f"tp{par['tp']}"]
    for key in ("pp", "cp", "ep"):
        if par.get(key, 1) > 1:
            parts.append(f"{key}{par[key]}")
    parts.append(f"dp{par['dp']}")
    if par.get("vpp", 1) > 1:
        parts.append(f"vpp{par['vpp']}")
    parts.append(f"mb{par['micro_batch']}")
    if par.get("zero"):
        parts.append(f"z{par['zero']}")
    if par.get("sp"):
        parts.append("sp")
    parts.append(f"rc-{par['recompute']}")
    return " ".join(parts)


def run(p: dict, tmp: Path) -> dict:
    model = p["model"]
    if isinstance(model, dict):
        f = tmp / f"{p['name']}.yaml"
        f.write_text(yaml.safe_dump(model, sort_keys=False))
        model = str(f)
    cmd = [PLANNER, "plan", "--model", model, "--cluster", "dgx-a100-80gb", "--seq-len", "2048",
           "--dtype", "fp16", "--max-time", "60", "--gpus", str(p["gpus"]), "--global-batch", str(p["batch"]),
           "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if res.returncode != 0:
        return dict(name=p["name"], error=res.stderr.strip()[-400:])
    best = json.loads(res.stdout)["plans"][0]
    est = best["estimate"]
    unc = best.get("uncertainty") or {}
    return dict(name=p["name"], gpus=p["gpus"], batch=p["batch"], mfu=est["mfu"], mfu_causal=unc.get("mfu_causal"),
                flagged=bool(unc.get("mfu_flag")), step_time_s=est["step_time_s"],
                target=best.get("target", ""), layout=layout(best["parallel"]), time=est["time"],
                peak_gib=est["memory"]["peak_bytes"] / 2**30)


def published_a100_mfu(top: int = 3) -> list[tuple[float, float, str]]:
    """The published dense 16-bit A100 runs on file with the highest MFU, by the causal count the MFU
    ceiling uses and by the full count the planner prints (``costmodel.ceilings``: published tokens/s
    per GPU, however published, times the model's FLOPs per token, over the dense peak): what the free
    choice is held against. Sorted by the causal count."""
    from costmodel.ceilings import causal_mfu
    from costmodel.layers import model_flops_per_token
    from planner.cli.validation import all_cases, case_inputs
    from planner.cli.validation_cross import published_tokens_per_s

    out = []
    for case, _split in all_cases():
        model, cluster, wl = case_inputs(case)[:3]
        gpu = cluster.groups[0].gpu
        if model.is_moe or case.get("dtype") == "fp8" or not gpu.name.startswith("A100"):
            continue
        pub = published_tokens_per_s(case, model, gpu.peak(wl.dtype))
        if pub is None:
            continue
        full = pub[0] * model_flops_per_token(model, wl.seq_len) / gpu.peak(wl.dtype)
        out.append((causal_mfu(full, model, wl.seq_len), full, case["name"]))
    return sorted(out, reverse=True)[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--only", default="", help="run only problems whose name contains this")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for p in problems():
            if args.only and args.only not in p["name"]:
                continue
            r = run(p, Path(d))
            rows.append(r)
            if "error" in r:
                print(f"{r['name']:<22} ERROR {r['error']}", flush=True)
                continue
            print(f"{r['name']:<22} {r['gpus']:>5} GPUs batch {r['batch']:>5}  MFU {100 * r['mfu']:5.1f}% "
                  f"(causal {100 * r['mfu_causal']:5.1f}%{', flagged' if r['flagged'] else ''})  "
                  f"step {r['step_time_s']:7.2f} s  peak {r['peak_gib']:5.1f} GiB  {r['target']}: {r['layout']}",
                  flush=True)
    ok = [r for r in rows if "mfu" in r]
    if ok:
        over = [r for r in ok if r["mfu"] > 0.62]
        print(f"largest MFU {100 * max(r['mfu'] for r in ok):.1f}%; above 62%: {len(over)} of {len(ok)}; "
              f"flagged above the A100 ceiling: {sum(r['flagged'] for r in ok)} of {len(ok)}")
        best = ", ".join(f"{name} {100 * c:.1f}% ({100 * f:.1f}% full)" for c, f, name in published_a100_mfu())
        print(f"published A100 runs by the causal count (tokens/s x causal model FLOPs per token / peak): {best}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
