"""The serving frontier: output tokens/s per GPU against tokens/s per user (1 / TPOT), over
concurrency and layouts, aggregated and disaggregated.

Every scored point (the aggregated candidates' steady states over their decode-batch grids, and
``serving_disagg.frontier_points`` for every disaggregated layout and decode batch) that meets
the TTFT goal is a point; the frontier is the upper envelope: sorted by tokens/s per user,
fastest first, a point stays when it gives more tokens/s per GPU than every faster one. The
TPOT goal is a vertical line on it (per-user speed at least 1 / TPOT goal), not a filter, so the
curve shows what a looser goal would buy.
"""
from __future__ import annotations

from typing import Any

from planner.search.serving_space import Candidate


def _agg_point(c: Candidate) -> dict[str, Any]:
    e = c.est
    return {"kind": "disaggregated" if c.disaggregated else "aggregated", "layout": c.layout(),
            "concurrency": e.schedule.get("concurrency", c.batch), "decode_batch": e.schedule.get("decode_batch"),
            "ttft_s": e.ttft_s, "tpot_s": e.tpot_s, "tokens_per_s_per_user": 1.0 / e.tpot_s,
            "output_tokens_per_s_per_gpu": e.output_tokens_per_s_per_gpu}


def _layout_of(p) -> str:
    def one(pool) -> str:
        return (f"tp{pool.tp}" + (f" pp{pool.pp}" if pool.pp > 1 else "") + (f" ep{pool.ep}" if pool.ep > 1 else "")
                + f" x{pool.replicas}")
    return f"P: {one(p['prefill'])} | D: {one(p['decode'])}"


def envelope(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The upper envelope (module docstring), fastest per user first."""
    pts = sorted(points, key=lambda p: (-p["tokens_per_s_per_user"], -p["output_tokens_per_s_per_gpu"]))
    out, best = [], -1.0
    for p in pts:
        if p["output_tokens_per_s_per_gpu"] > best * (1 + 1e-9):
            out.append(p)
            best = p["output_tokens_per_s_per_gpu"]
    return out


def frontier(cands: list[Candidate], disagg_points: list[dict], ttft_slo_s: float | None = None) -> list[dict]:
    """The frontier of the aggregated candidates and the disaggregated points (module docstring)."""
    pts = [_agg_point(c) for c in cands if not c.disaggregated]
    for p in disagg_points:
        q = dict(p)
        q["kind"] = "disaggregated"
        q["layout"] = _layout_of(p)
        q["prefill"], q["decode"] = p["prefill"].to_dict(), p["decode"].to_dict()
        q["concurrency"] = None
        pts.append(q)
    if ttft_slo_s is not None:
        pts = [p for p in pts if p["ttft_s"] <= ttft_slo_s]
    return envelope(pts)


def chosen_point(c: Candidate) -> dict[str, Any]:
    return _agg_point(c)
