"""The figures of ``planner explain --html``, drawn with matplotlib (Agg, no display).

Each function takes estimates (``costmodel.training.Estimate``) and returns a ``Figure`` laid out
with constrained layout, legends outside the axes, so that nothing is cut when the PNG is saved
at the figure's own size (tests check exactly that: every artist inside the canvas):

* memory per pipeline stage: stacked categories against the GPU's capacity (a black dashed line,
  a colour no category uses), integer stage ticks labelled with their layers;
* time per step by term: one stacked bar per plan, the chosen plan and its runners-up;
* the pipeline schedule: one outlined block per micro-batch's forward or backward on each stage,
  numbered;
* the top plans: step time relative to the best, in percent, so a 0.2% spread reads as 0.2%.
"""
from __future__ import annotations

import io
from typing import Any, Sequence

from costmodel.units import GIB

MEMORY_CATS = (("weights_bytes", "weights", "#4C72B0"), ("grads_bytes", "gradients", "#DD8452"),
               ("optimizer_bytes", "optimizer state", "#55A868"), ("activations_bytes", "activations", "#8172B3"),
               ("other_bytes", "other", "#BBBBBB"))
TIME_TERMS = (("compute_s", "compute", "#4C72B0"), ("recompute_s", "recompute", "#64B5CD"),
              ("tp_comm_s", "TP comm", "#DD8452"), ("cp_comm_s", "CP comm", "#CCB974"),
              ("ep_comm_s", "EP all-to-all", "#DA8BC3"), ("dp_comm_s", "DP comm (exposed)", "#C44E52"),
              ("pp_comm_s", "PP sends", "#937860"), ("bubble_s", "pipeline bubble", "#8C8C8C"),
              ("optimizer_s", "optimizer step", "#55A868"))
FWD, BWD = "#4C72B0", "#DD8452"


def _figure(width: float, height: float):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png(fig) -> bytes:
    """The figure as PNG at its own size (no tight-bbox cropping: what a test checks is what ships)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def memory_figure(est, title: str = ""):
    stages = est.stages
    n = len(stages)
    fig = _figure(max(6.0, 2.2 + 0.9 * n), 3.6)
    ax = fig.subplots()
    x = list(range(n))
    bottom = [0.0] * n
    for key, label, colour in MEMORY_CATS:
        vals = [s.memory.get(key, 0.0) / GIB for s in stages]
        ax.bar(x, vals, bottom=bottom, width=0.6, label=label, color=colour, edgecolor="white", linewidth=0.5)
        bottom = [b + v for b, v in zip(bottom, vals)]
    caps = [s.capacity_bytes / GIB for s in stages]
    for k, cap in enumerate(caps):
        ax.hlines(cap, k - 0.42, k + 0.42, colors="black", linestyles="--", linewidth=1.5,
                  label="GPU capacity" if k == 0 else None)
    for k, (top, cap) in enumerate(zip(bottom, caps)):
        ax.annotate(f"{top:.1f} / {cap:.0f} GiB", (k, max(top, cap)), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7, color="#C44E52" if top > cap else "black")
    groups = len({s.group for s in stages}) > 1          # a mixed cluster: say which node group
    ax.set_xticks(x, [f"stage {s.index}" + (f" ({s.group})" if groups else "") + f"\n{s.num_layers} layers"
                      + (f"\n{s.recompute_layers} recomputed"
                                                                   if s.recompute_layers else "")
                      for s in stages], fontsize=8)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(0, max(max(caps), max(bottom)) * 1.15)
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title or "memory per GPU on each pipeline stage", fontsize=10, wrap=True)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return fig


def time_figure(rows: Sequence[tuple[str, Any]], title: str = ""):
    """``rows``: (label, estimate), the chosen plan first."""
    used = [(k, lab, col) for k, lab, col in TIME_TERMS if any(e.time.get(k, 0.0) > 0 for _, e in rows)]
    fig = _figure(9.0, 1.4 + 0.55 * len(rows))
    ax = fig.subplots()
    ys = list(range(len(rows)))
    left = [0.0] * len(rows)
    for key, label, colour in used:
        vals = [e.time.get(key, 0.0) for _, e in rows]
        ax.barh(ys, vals, left=left, height=0.6, label=label, color=colour, edgecolor="white", linewidth=0.5)
        left = [a + v for a, v in zip(left, vals)]
    best = min(e.step_time_s for _, e in rows)
    for y, (_, e) in zip(ys, rows):
        ax.annotate(f"{e.step_time_s:.4g} s" + (f" (+{(e.step_time_s / best - 1) * 100:.1f}%)"
                                                 if e.step_time_s > best * (1 + 1e-9) else ""),
                    (e.step_time_s, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(ys, [label for label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.18)
    ax.set_xlabel("seconds per step")
    ax.set_title(title or "time per step by term: the chosen plan (top) and its runners-up", fontsize=10)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return fig


def timeline_figure(intervals, pp: int, micro_shown: int, micro_total: int, schedule: str, vpp: int):
    """``intervals[stage] = (forward blocks, backward blocks)``, each block (start, length, micro-batch)."""
    fig = _figure(10.0, 1.3 + 0.42 * pp)
    ax = fig.subplots()
    end = 0.0
    for stage, (fwd, bwd) in enumerate(intervals):
        for blocks, colour, text_colour in ((fwd, FWD, "white"), (bwd, BWD, "black")):
            for start, length, mb in blocks:
                ax.broken_barh([(start, length)], (stage - 0.38, 0.76), facecolors=colour, edgecolors="black",
                               linewidth=0.6)
                ax.text(start + length / 2, stage, str(mb + 1), ha="center", va="center", fontsize=6.5,
                        color=text_colour)
                end = max(end, start + length)
    ax.set_yticks(range(pp), [f"stage {s}" for s in range(pp)], fontsize=8)
    ax.set_ylim(pp - 0.5, -0.5)
    ax.set_xlim(0, end * 1.01 or 1.0)
    ax.set_xlabel("seconds from the start of the step (white: idle)"
                  + (f"; each block is one of {vpp} model chunks per stage" if vpp > 1 else ""))
    shown = (f"drawn for {micro_shown} micro-batches; the plan runs {micro_total} (the steady middle repeats)"
             if micro_shown < micro_total else f"all {micro_total} micro-batches")
    kind = {"1f1b": "1F1B", "interleaved": f"interleaved 1F1B, {vpp} chunks per stage"}.get(schedule, schedule)
    ax.set_title(f"pipeline schedule ({kind}): blocks numbered by micro-batch\n{shown}", fontsize=10, wrap=True)
    from matplotlib.patches import Patch
    fig.legend(handles=[Patch(facecolor=FWD, edgecolor="black", label="forward"),
                        Patch(facecolor=BWD, edgecolor="black", label="backward")],
               loc="outside right upper", fontsize=8, frameon=False)
    return fig


def topk_figure(rows: Sequence[tuple[str, Any, bool]], band: float = 0.0):
    """``rows``: (label, estimate, is the chosen plan), best first. Bars: % slower than the best;
    shaded, the cost model's error band (``band``, relative: ``costmodel.uncertainty``): plans
    inside it are ties, and the axis is at least that wide so a small spread is not magnified."""
    best = min(e.step_time_s for _, e, _ in rows)
    pct = [(e.step_time_s / best - 1) * 100 for _, e, _ in rows]
    fig = _figure(10.5, 1.5 + 0.55 * len(rows))
    ax = fig.subplots()
    ys = list(range(len(rows)))
    colours = ["#C44E52" if chosen else "#4C72B0" for _, _, chosen in rows]
    ax.barh(ys, pct, height=0.6, color=colours)
    span = max(pct) or 1.0
    for y, p, (_, e, chosen) in zip(ys, pct, rows):
        ax.annotate(f"+{p:.2f}%  ({e.step_time_s:.4g} s, {e.tokens_per_s_per_gpu:,.0f} tok/s/GPU, "
                    f"{e.peak_bytes / GIB:.1f} GiB)" + ("  <- this plan" if chosen else ""),
                    (p, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(ys, [label for label, _, _ in rows], fontsize=7)
    for tick, (_, _, chosen) in zip(ax.get_yticklabels(), rows):
        if chosen:
            tick.set_color("#C44E52")
            tick.set_fontweight("bold")
    ax.scatter([p for p, (_, _, c) in zip(pct, rows) if c], [y for y, (_, _, c) in zip(ys, rows) if c],
               marker="D", color="#C44E52", zorder=3, clip_on=False)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    if band > 0:
        ax.axvspan(0, band * 100, color="#E5E5E5", zorder=0, lw=0)
        ax.text(band * 100, len(rows) - 0.45, f" error band \u00b1{band * 100:.0f}%", fontsize=7, color="#555555",
                va="bottom", ha="right")
    ax.set_xlim(0, max(span * 2.6, band * 100 * 1.9))
    ax.set_xlabel("step time, % slower than the best plan" + ("; grey: the model's error band (ties)" if band > 0 else ""))
    tie = band > 0 and span <= band * 100
    ax.set_title(f"the top {len(rows)} plans: the spread is {span:.2f}% of the step time"
                 + (f", inside the model's \u00b1{band * 100:.0f}% error: a tie" if tie else ""), fontsize=10)
    return fig


# --------------------------------------------------------------------------------------
# Checks a test (or a reader) can run on a figure: nothing cut off, something drawn
# --------------------------------------------------------------------------------------

def layout_problems(fig) -> list[str]:
    """Everything that would make the figure hard to read: what is cut off at the canvas edge
    (``clipped_artists``) and figure legends that overlap an axes or its title."""
    out = clipped_artists(fig)
    r = fig.canvas.get_renderer()
    for lg in fig.legends:
        lb = lg.get_window_extent(r)
        for ax in fig.axes:
            for name, b in (("axes", ax.get_window_extent(r)), (f"title {ax.get_title()!r}", ax.title.get_window_extent(r))):
                if lb.overlaps(b) and (name == "axes" or ax.get_title()):
                    out.append(f"legend overlaps {name}")
    return out


def clipped_artists(fig, tolerance_px: float = 1.0) -> list[str]:
    """What a PNG saved at the figure's size would cut: each axes (with its drawn ticks, labels,
    title and annotations), each legend and each text that reaches outside the canvas, as
    ``"axes 'title': x0,y0-x1,y1 outside 0,0-W,H"`` (pixels)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    W, H = fig.bbox.width, fig.bbox.height
    items = []
    for ax in fig.axes:
        items.append((f"axes {ax.get_title()!r}", ax.get_tightbbox(r)))
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        items += [(f"text {t.get_text()!r}", t.get_window_extent(r)) for t in texts
                  if t.get_visible() and t.get_text().strip()]
        if ax.get_legend():
            items.append(("axes legend", ax.get_legend().get_window_extent(r)))
    items += [("figure legend", lg.get_window_extent(r)) for lg in fig.legends]
    items += [(f"text {t.get_text()!r}", t.get_window_extent(r)) for t in fig.texts
              if t.get_visible() and t.get_text().strip()]
    out = []
    for name, b in items:
        if b is None:
            continue
        if b.x0 < -tolerance_px or b.y0 < -tolerance_px or b.x1 > W + tolerance_px or b.y1 > H + tolerance_px:
            out.append(f"{name}: {b.x0:.0f},{b.y0:.0f}-{b.x1:.0f},{b.y1:.0f} outside 0,0-{W:.0f},{H:.0f}")
    return out


def ink_fraction(png_bytes: bytes) -> float:
    """The fraction of pixels that are not (near) white: 0 for a blank image."""
    import matplotlib.image as mpimg
    img = mpimg.imread(io.BytesIO(png_bytes), format="png")
    rgb = img[..., :3]
    return float(((rgb < 0.94).any(axis=-1)).mean())
