"""The profile report: Markdown for reading in a terminal or a pull request, and one
self-contained HTML page (plots embedded as base64 PNG, no external files or scripts).

Owns: ``write_report(profile, out)`` -> ``{"report_md": path, "report_html": path}``. The two
pages are rendered from one list of blocks (heading, text, table, figure), so they say the
same thing; figures appear only in the HTML. Every measured figure stands beside its datasheet
(catalog) figure. Plots: bus bandwidth against message size per operation and group (tier),
matmul throughput and efficiency against size, copy bandwidth against size, the topology matrix.
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from costmodel.units import GB, GIB, MIB, TERA, US

from .bench_collectives import OPS, busbw_factor
from .probe import TOPOLOGY_MEANING


# --------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------

def _h(level: int, text: str) -> tuple:
    return ("h", level, text)


def _p(text: str) -> tuple:
    return ("p", text)


def _table(headers: list[str], rows: list[list[Any]]) -> tuple:
    return ("table", headers, rows)


def _fig(title: str, png: bytes) -> tuple:
    return ("fig", title, png)


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.{nd}g}"
    return str(x)


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def _ratio(measured: float | None, sheet: float | None) -> str:
    if not measured or not sheet:
        return "-"
    return f"{measured / sheet:.0%}"


# --------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------

def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


def _plot_collectives(prof: Any) -> bytes | None:
    from matplotlib.figure import Figure
    rows = prof.result.get("collectives") or []
    if not rows:
        return None
    ops = [o for o in OPS if any(r["op"] == o for r in rows)]
    fig = Figure(layout="constrained", figsize=(3.3 * len(ops), 3.2))
    axes = fig.subplots(1, len(ops), sharey=True, squeeze=False)
    groups = list(dict.fromkeys(r["group"] for r in rows))
    from matplotlib import rcParams
    colors = rcParams["axes.prop_cycle"].by_key()["color"]
    fits = {(f.group, f.op): f for f in prof.fits}
    for ax, op in zip(axes[0], ops):
        for gi, g in enumerate(groups):
            pts = sorted((r["bytes"], r["busbw_bytes_per_s"] / GB, r["tier"], r["group_size"])
                         for r in rows if r["op"] == op and r["group"] == g)
            if not pts:
                continue
            tier, n = pts[0][2], pts[0][3]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if tier == "intra" else "s--",
                    color=colors[gi % len(colors)], label=f"{g} ({tier}, n={n})", ms=3)
            f = fits.get((g, op))
            if f is not None:
                xs = [p[0] for p in pts]
                ax.plot(xs, [x * busbw_factor(op, n) / f.predict_s(x) / GB for x in xs], ":",
                        color=colors[gi % len(colors)], lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("message bytes", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("bus bandwidth GB/s", fontsize=8)
    for tier, key in (("intra", "intra_node"), ("inter", "inter_node")):
        sheet = ((prof.datasheet or {}).get(key) or {}).get("gb_per_s")
        if sheet and any(r["tier"] == tier for r in rows):
            for ax in axes[0]:
                ax.axhline(sheet, color="grey", lw=0.8, ls="-." if tier == "inter" else "-")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("Bus bandwidth against message size (dotted: alpha-beta fit; grey: datasheet link)", fontsize=9, wrap=True)
    return _png(fig)


def _plot_matmul(prof: Any) -> bytes | None:
    from matplotlib.figure import Figure
    mm = [r for r in prof.result.get("matmul") or [] if r["m"] == r["n"] == r["k"]]
    if not mm:
        return None
    fig = Figure(layout="constrained", figsize=(9, 3.2))
    a1, a2 = fig.subplots(1, 2)
    tf = prof.cluster["gpu"]["tflops"]
    for dt in dict.fromkeys(r["dtype"] for r in mm):
        pts = sorted((r["size"], r["flops_per_s"] / TERA) for r in mm if r["dtype"] == dt)
        line, = a1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=dt)
        peak = tf.get(dt)
        if peak:
            a1.axhline(peak, color=line.get_color(), lw=0.8, ls=":")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("square GEMM size", fontsize=8)
    a1.set_ylabel("TFLOP/s", fontsize=8)
    a1.set_title("Achieved throughput (dotted: peak used)", fontsize=9, wrap=True)
    a1.legend(fontsize=7)
    table = prof.cluster.get("measured", {}).get("matmul") or []
    if table:
        g = prof.cluster["gpu"]
        xs = [s for s, _ in table]
        a2.plot(xs, [e for _, e in table], "o-", ms=3, label=f"measured ({prof.summary['matmul']['dtype']})")
        a2.plot(xs, [g["matmul_efficiency"] * s / (s + g["matmul_half_size"]) for s in xs], ":",
                label=f"fit e={g['matmul_efficiency']:.2f}, half={g['matmul_half_size']:.0f}")
        sheet = ((prof.datasheet or {}).get("gpu") or {})
        if sheet.get("matmul_efficiency"):
            a2.plot(xs, [sheet["matmul_efficiency"] * s / (s + sheet["matmul_half_size"]) for s in xs], "--",
                    color="grey", label="catalog model")
        a2.set_xscale("log", base=2)
        a2.set_ylim(0, 1.05)
        a2.set_xlabel("GEMM size (geometric mean of m, n, k)", fontsize=8)
        a2.set_ylabel("efficiency (achieved / peak)", fontsize=8)
        a2.set_title("Matmul efficiency", fontsize=9, wrap=True)
        a2.legend(fontsize=7)
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.tick_params(labelsize=7)
    return _png(fig)


def _plot_memory(prof: Any) -> bytes | None:
    from matplotlib.figure import Figure
    mem = prof.result.get("memory") or []
    if not mem:
        return None
    fig = Figure(layout="constrained", figsize=(4.5, 3))
    ax = fig.subplots()
    pts = sorted((r["bytes"], r["bandwidth_bytes_per_s"] / GB) for r in mem)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label="measured copy")
    sheet = ((prof.datasheet or {}).get("gpu") or {}).get("hbm_gb_per_s")
    if sheet:
        ax.axhline(sheet, color="grey", lw=0.8, label=f"catalog {sheet:g} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer bytes", fontsize=8)
    ax.set_ylabel("GB/s (read + write)", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.tick_params(labelsize=7)
    return _png(fig)


def _topology(prof: Any) -> tuple[list[str], list[list[str]], str]:
    """Labels, the matrix and what it shows: NVML topology when there are GPUs, else the ranks
    and the tier that joins each pair (same node or not)."""
    pr = prof.probe
    if pr.gpus and pr.topology:
        return [f"GPU{g.index}" for g in pr.gpus], pr.topology, "NVML topology (nvidia-smi topo -m)"
    ranks = prof.result.get("ranks") or []
    labels = [f"r{r['rank']} {r['node']}"[:18] for r in ranks]
    m = [["X" if a["rank"] == b["rank"] else ("intra" if a["node"] == b["node"] else "inter") for b in ranks]
         for a in ranks]
    return labels, m, "ranks and the tier joining each pair (same node: intra; else inter)"


_LEVEL_ORDER = ["X", "NV", "BOARD", "PIX", "PXB", "PHB", "NODE", "SYS", "intra", "inter", "?"]


def _plot_topology(prof: Any) -> bytes | None:
    from matplotlib.figure import Figure
    labels, m, title = _topology(prof)
    if len(labels) < 2:
        return None
    n = len(labels)

    def level(v: str) -> int:
        key = "NV" if v.startswith("NV") else v
        return _LEVEL_ORDER.index(key) if key in _LEVEL_ORDER else len(_LEVEL_ORDER)

    fig = Figure(layout="constrained", figsize=(max(4.5, 0.55 * n + 2), 0.55 * n + 1.6))
    ax = fig.subplots()
    ax.imshow([[level(v) for v in row] for row in m], cmap="viridis_r", vmin=0, vmax=len(_LEVEL_ORDER))
    for i in range(n):
        for j in range(n):
            ax.text(j, i, m[i][j], ha="center", va="center", fontsize=7, color="white" if level(m[i][j]) > 4 else "black")
    ax.set_xticks(range(n), labels, rotation=60, fontsize=7)
    ax.set_yticks(range(n), labels, fontsize=7)
    ax.set_title(title, fontsize=9, wrap=True)   # wrapped to the figure's width: never clipped
    return _png(fig)


# --------------------------------------------------------------------------------------
# Content
# --------------------------------------------------------------------------------------

def _published_attention(gpu_name: str, kernel: str, direction: str, mask: str, head_dim: float,
                         seq: float) -> float:
    """The published curve ``costmodel.attention`` prices ``kernel`` with on a GPU of this name."""
    from costmodel.attention import efficiency
    from costmodel.specs import GpuSpec
    g = GpuSpec(name=gpu_name, memory_bytes=1.0e10, peak_flops_per_s={"bf16": 1.0}, hbm_bandwidth_bytes_per_s=1.0,
                reserved_bytes=0.0)
    return efficiency(kernel, g, head_dim, seq, mask == "causal", direction)


def _blocks(prof: Any, plots: bool) -> list[tuple]:
    c, s, pr = prof.cluster, prof.summary, prof.probe
    pv = c.get("provenance", {})
    sheet = prof.datasheet or {}
    sg = sheet.get("gpu") or {}
    catalog = pv.get("datasheet", {}).get("catalog") if c["gpu"]["name"] != "cpu-process" else "cpu"
    B: list[tuple] = [_h(1, f"Hardware profile: {c['name']}")]
    B.append(_p(f"{c['description']}. Measured {pv.get('date')} with {pv.get('tool')}; "
                f"{'quick run' if s.get('quick') else 'full run'}; start-up and measurements took {s.get('measure_time_s')} s. "
                f"Method: {pv.get('method')}. Versions: " + ", ".join(f"{k} {v}" for k, v in pv.get("versions", {}).items() if v)
                + "."))
    if pr.note:
        B.append(_p(f"Note: {pr.note}."))
    B.append(_p(f"Cluster file: `{Path(s.get('cluster_file', 'cluster.yaml')).name}` "
                f"(`planner plan --cluster {Path(s.get('cluster_file', 'cluster.yaml')).name}`). Datasheet figures are "
                f"from the catalog entry `{catalog or 'unknown'}`" + (" (the `cpu` entry's figures are "
                "placeholders, not a datasheet)" if catalog == "cpu" else "") + "."))
    # --- summary
    B.append(_h(2, "Measured against the datasheet"))
    mmS = s["matmul"]
    rows = [["memory per GPU", f"{c['gpu']['memory_gib']:.1f} GiB", _fmt(sg.get("memory_gib")) + " GiB" if sg else "-",
             _ratio(c["gpu"]["memory_gib"], sg.get("memory_gib"))],
            [f"matmul {mmS['dtype']} best", f"{_fmt(mmS['best_tflops'])} TFLOP/s",
             f"{_fmt(mmS['datasheet_tflops'])} TFLOP/s" if mmS.get("datasheet_tflops") else "-",
             _ratio(mmS["best_tflops"], mmS.get("datasheet_tflops"))],
            ["matmul efficiency (large GEMM) / half size", f"{_fmt(mmS['efficiency_max'])} / {_fmt(mmS['half_size'])}",
             f"{_fmt(sg.get('matmul_efficiency'))} / {_fmt(sg.get('matmul_half_size'))}" if sg else "-", "-"],
            ["memory copy bandwidth", f"{_fmt(s['memory']['copy_gb_per_s'])} GB/s",
             f"{_fmt(s['memory']['datasheet_gb_per_s'])} GB/s" if s["memory"].get("datasheet_gb_per_s") else "-",
             _ratio(s["memory"]["copy_gb_per_s"], s["memory"].get("datasheet_gb_per_s"))]]
    for tier, key in (("intra", "intra_node"), ("inter", "inter_node")):
        t = s["tiers"].get(tier)
        sl = sheet.get(key) or {}
        if t:
            rows.append([f"{tier}-node bus bandwidth ({t['op']}, {t['group']} of {t['group_size']}, fitted)",
                         f"{_fmt(t['busbw_gb_per_s'])} GB/s", f"{_fmt(sl.get('gb_per_s'))} GB/s" if sl else "-",
                         _ratio(t["busbw_gb_per_s"], sl.get("gb_per_s"))])
            rows.append([f"{tier}-node latency per ring step", f"{_fmt(t['latency_us'])} us",
                         f"{_fmt(sl.get('latency_us'))} us" if sl else "-", "-"])
        else:
            rows.append([f"{tier}-node link", "not measured" + (" (one node)" if tier == "inter" else ""),
                         f"{_fmt(sl.get('gb_per_s'))} GB/s" if sl else "-", "-"])
    if s.get("compute_comm_slowdown") is not None:
        rows.append(["compute slowdown while all-reduce overlaps", f"{s['compute_comm_slowdown']:.1%}", "-", "-"])
    B.append(_table(["quantity", "measured", "datasheet", "measured / datasheet"], rows))
    # --- probe
    B.append(_h(2, "Machine"))
    if pr.gpus:
        B.append(_p(pr.summary()))
        B.append(_table(["GPU", "name", "memory GiB (free)", "PCIe max (now)", "NVLink", "power limit", "NUMA",
                         "CPU affinity"],
                        [[g.index, g.name, f"{g.memory_total_bytes / GIB:.1f} ({g.memory_free_bytes / GIB:.1f})",
                          f"gen{g.pcie_gen_max} x{g.pcie_width_max} (gen{g.pcie_gen_current} x{g.pcie_width_current})",
                          (f"{g.nvlink_links} links, {g.nvlink_gb_per_s:.0f} GB/s"
                           + (" via NVSwitch" if g.nvlink_switch_links else "")) if g.nvlink_links else "none",
                          f"{g.power_limit_w:g} W" if g.power_limit_w else "-",
                          _fmt(g.numa_node), g.cpu_affinity or "-"] for g in pr.gpus]))
    else:
        B.append(_p(f"{pr.host}: {pr.cpu_count} CPUs ({pr.cpu_model or 'unknown model'}), "
                    f"{pr.host_memory_bytes / GIB:.1f} GiB memory; each rank is one process standing for one GPU."))
    labels, m, what = _topology(prof)
    if len(labels) >= 2:
        B.append(_h(3, f"Topology: {what}"))
        B.append(_table([""] + labels, [[labels[i]] + row for i, row in enumerate(m)]))
        if pr.gpus:
            B.append(_p("Legend: " + "; ".join(f"{k}: {v}" for k, v in TOPOLOGY_MEANING.items()) + "."))
        if plots:
            png = _plot_topology(prof)
            if png:
                B.append(_fig("topology", png))
    # --- matmul
    mm = prof.result.get("matmul") or []
    if mm:
        B.append(_h(2, "Matmul throughput"))
        tf = c["gpu"]["tflops"]
        B.append(_p(f"Peak used for the efficiency: {pv.get('matmul_peak')}; efficiency table dtype "
                    f"{mmS['dtype']} (the cluster file's `measured.matmul`). Fit: efficiency = "
                    f"{_fmt(mmS['efficiency_max'])} x s / (s + {_fmt(mmS['half_size'])})."))
        B.append(_table(["dtype", "m x n x k", "TFLOP/s", "peak TFLOP/s", "efficiency"],
                        [[r["dtype"], f"{r['m']}x{r['n']}x{r['k']}", _fmt(r["flops_per_s"] / TERA),
                          _fmt(tf.get(r["dtype"])), _fmt(r["flops_per_s"] / TERA / tf[r["dtype"]]) if tf.get(r["dtype"]) else "-"]
                         for r in mm]))
        if plots:
            png = _plot_matmul(prof)
            if png:
                B.append(_fig("matmul", png))
    attn = c["gpu"].get("attention_table") or []
    if attn:
        B.append(_h(2, "Fused attention"))
        B.append(_p("`F.scaled_dot_product_attention` with each kernel this PyTorch offers forced (on a CPU its own "
                    "kernel, recorded as fa2); efficiency = FLOPs (forward 4 b s^2 h d, halved when causal; backward "
                    "2.5 times that) / time / peak of the precision measured. The cost model prices these kernels on "
                    "these points (the cluster file's `gpu.attention_table`); 'published' is the curve it would use "
                    "otherwise, on the catalog architecture of this device's name."))
        B.append(_table(["kernel", "direction", "mask", "head dim", "sequence", "efficiency", "published"],
                        [[k, d, m, _fmt(hd), _fmt(sl), _fmt(e), _fmt(_published_attention(c["gpu"]["name"], k, d, m, hd, sl))]
                         for k, d, m, hd, sl, e in attn]))
    mem = prof.result.get("memory") or []
    if mem:
        B.append(_h(2, "Memory copy bandwidth"))
        B.append(_table(["buffer", "GB/s (read + write)"],
                        [[_bytes(r["bytes"]), _fmt(r["bandwidth_bytes_per_s"] / GB)] for r in mem]))
        if plots:
            png = _plot_memory(prof)
            if png:
                B.append(_fig("memory", png))
    # --- collectives
    coll = prof.result.get("collectives") or []
    if coll:
        B.append(_h(2, "Collectives"))
        B.append(_p("nccl-tests convention: algbw = S / t, busbw = algbw x factor (all-reduce 2(n-1)/n; all-gather, "
                    "reduce-scatter, all-to-all (n-1)/n; send/recv 1); t is the slowest rank's. Fit per group and "
                    "operation: t = hops x alpha + S x factor / B (hops: all-reduce 2(n-1), others n-1, send/recv 1)."))
        B.append(_table(["tier", "group", "n", "op", "alpha us / step", "B GB/s (fit)", "best busbw GB/s", "fit rms error"],
                        [[f.tier, f.group, f.group_size, f.op, _fmt(f.alpha_s / US), _fmt(f.bandwidth_bytes_per_s / GB),
                          _fmt(f.max_busbw_bytes_per_s / GB), f"{f.rms_rel_error:.0%}"] for f in prof.fits]))
        groups = list(dict.fromkeys((r["group"], r["op"]) for r in coll))
        sizes = sorted({r["bytes"] for r in coll})
        near = {}
        for g, op in groups:
            for sz in sizes:
                for r in coll:
                    if r["group"] == g and r["op"] == op and abs(r["bytes"] - sz) <= sz * 0.01:
                        near[(g, op, sz)] = r
        B.append(_h(3, "Bus bandwidth GB/s by message size"))
        B.append(_table(["bytes"] + [f"{g}/{op}" for g, op in groups],
                        [[_bytes(sz)] + [_fmt(near[(g, op, sz)]["busbw_bytes_per_s"] / GB) if (g, op, sz) in near else "-"
                                         for g, op in groups] for sz in sizes]))
        if plots:
            png = _plot_collectives(prof)
            if png:
                B.append(_fig("collectives", png))
    ov = (c.get("provenance") or {}).get("overlap")
    if ov:
        B.append(_h(2, "Compute and communication overlap"))
        B.append(_p(f"bf16 GEMM {ov['gemm_size']}^3: {ov['gemm_alone_s'] * 1e3:.2f} ms alone, "
                    f"{ov['gemm_overlapped_s'] * 1e3:.2f} ms while all-reduces of {_bytes(ov['allreduce_bytes'])} run "
                    f"(compute slowdown {ov['compute_slowdown']:.1%})."))
    B.append(_h(2, "Files"))
    B.append(_table(["what", "file"], [[k, f"`{Path(v).name}`"] for k, v in (s.get("files") or {}).items()]))
    return B


def _md(blocks: list[tuple]) -> str:
    out = []
    for b in blocks:
        if b[0] == "h":
            out.append("#" * b[1] + " " + b[2])
        elif b[0] == "p":
            out.append(b[1])
        elif b[0] == "table":
            headers, rows = b[1], b[2]
            out.append("| " + " | ".join(map(str, headers)) + " |")
            out.append("|" + "---|" * len(headers))
            out += ["| " + " | ".join(_fmt(x) for x in row) + " |" for row in rows]
        elif b[0] == "fig":
            continue
        out.append("")
    out.append("Plots: `report.html` (self-contained).")
    return "\n".join(out) + "\n"


def _inline(text: str) -> str:
    """Escape, then `code` spans."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _html(blocks: list[tuple], title: str) -> str:
    body = []
    for b in blocks:
        if b[0] == "h":
            body.append(f"<h{b[1]}>{_inline(b[2])}</h{b[1]}>")
        elif b[0] == "p":
            body.append(f"<p>{_inline(b[1])}</p>")
        elif b[0] == "table":
            head = "".join(f"<th>{_inline(str(h))}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{_inline(_fmt(x))}</td>" for x in row) + "</tr>" for row in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif b[0] == "fig":
            data = base64.b64encode(b[2]).decode()
            body.append(f'<figure><img alt="{html.escape(b[1])}" src="data:image/png;base64,{data}"></figure>')
    style = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;margin:0.5em 0 1em;font-size:0.85em}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}"
             "td:first-child,th:first-child{text-align:left}code{background:#f3f3f3;padding:0 3px}"
             "img{max-width:100%}figure{margin:0.5em 0}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(prof: Any, out: Path) -> dict[str, str]:
    """Write ``report.md`` and ``report.html`` into ``out``."""
    out = Path(out)
    md, page = out / "report.md", out / "report.html"
    prof.summary.setdefault("files", {})
    prof.summary["files"].update({"report_md": str(md), "report_html": str(page)})
    from costmodel.files.safeio import write_text
    write_text(md, _md(_blocks(prof, plots=False)), "--out")
    write_text(page, _html(_blocks(prof, plots=True), f"Hardware profile: {prof.cluster['name']}"), "--out")
    return {"report_md": str(md), "report_html": str(page)}
