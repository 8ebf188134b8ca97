"""The HTML reports as a reader sees them.

Two levels. Always: every matplotlib figure of `planner explain --html` and of the profile report
is drawn and checked itself: something is drawn (ink on the page), nothing reaches outside the
canvas (each axes with its ticks, title and annotations, each legend and text), no figure legend
covers an axes or its title; and what each chart must show is there (integer stage ticks, a
capacity line in a colour no memory category uses, one bar per plan, numbered micro-batches, an
axis in % of the best). Every report page (training explain, serving explain, profile) is also rendered in headless
Chromium (`apt-get install -y chromium`): every embedded image is decoded from its base64 text
(a PNG, with ink), every image loads, none sticks out of the page, nothing scrolls sideways, the
page is no taller than its images and text need, and a screenshot of the page has ink throughout.
Without Chromium these tests skip, except in CI (`.ci/run` sets SHARDPLAN_CI=1 and installs
Chromium), where they fail.
"""
from __future__ import annotations

import base64
import functools
import io
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import planner.cli.figures as F
from planner.cli.explain import explain, figure_objects, html_report, schedule_order, shown_microbatches
from planner.plan.planfile import read_plan

pytestmark = [pytest.mark.solver, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[1]
PLANS = ["llama-3-70b-64xh100", "llama-3.1-405b-16384xh100", "llama-3-70b-mixed-h100-a100", "llama-3-8b-dgx-h100"]


@functools.lru_cache(maxsize=None)
def _info(name):
    plan = read_plan(ROOT / "plans" / f"{name}.yaml")
    return plan, explain(plan, what_if=False)


@pytest.mark.parametrize("name", PLANS)
def test_explain_figures_are_drawn_whole(name):
    plan, info = _info(name)
    figs = figure_objects(plan, info)
    titles = [t for t, _, _ in figs]
    assert titles[:2] == ["Memory per stage", "Step time by term"] and titles[-1] == "Top plans"
    assert ("Pipeline schedule" in titles) == (plan.parallel.pp > 1)
    for title, _, fig in figs:
        assert F.layout_problems(fig) == [], title
        assert F.ink_fraction(F.png(fig)) > 0.04, f"{title} is (nearly) blank"


def _interleaved(plan, vpp: int = 4):
    """The plan with its stages split into ``vpp`` interleaved chunks (the example plan's schedule is
    the planner's choice, which the charts' tests must not depend on)."""
    import dataclasses

    assert plan.parallel.pp > 1 and all(s.num_layers >= vpp for s in plan.stages)
    return plan.replace(parallel=dataclasses.replace(plan.parallel, vpp=vpp, schedule="interleaved"))


def test_what_each_chart_shows():
    plan, info = _info("llama-3-70b-64xh100")
    figs = {t: f for t, _, f in figure_objects(plan, info)}
    # memory: one integer tick per stage, the capacity a dashed black line no category shares
    ax = figs["Memory per stage"].axes[0]
    assert list(ax.get_xticks()) == list(range(plan.parallel.pp))
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == [f"stage {i}" for i in range(plan.parallel.pp)]
    cap = [c for c in ax.collections if c.get_linestyle()[0][1]]          # the dashed hlines
    assert len(cap) == plan.parallel.pp
    bar_colours = {tuple(p.get_facecolor()[:3]) for p in ax.patches}
    assert all(tuple(c.get_color()[0][:3]) not in bar_colours for c in cap)
    legend = figs["Memory per stage"].legends[0]
    assert [t.get_text() for t in legend.get_texts()][0] == "GPU capacity"
    # time by term: one stacked bar per plan, the chosen plan first, up to five plans
    ax = figs["Step time by term"].axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    n = min(5, len(info["solver"].solutions))
    assert len(labels) == n and labels[0].startswith("this plan")
    rights = {}
    for p in ax.patches:
        y = round(p.get_y() + p.get_height() / 2)
        rights[y] = max(rights.get(y, 0.0), p.get_x() + p.get_width())
    est = info["estimate"]
    assert rights[0] == pytest.approx(est.step_time_s, rel=1e-9)          # the terms add up to the step
    # the schedule: outlined blocks, each numbered with its micro-batch
    # an interleaved plan (vpp=4; the example's plan made so, whatever the planner chose): titled as such,
    # each block one model chunk
    iplan = _interleaved(plan)
    ax = {t: f for t, _, f in figure_objects(iplan, explain(iplan, what_if=False))}["Pipeline schedule"].axes[0]
    p = iplan.parallel
    assert p.schedule == "interleaved" and f"interleaved 1F1B, {p.vpp} chunks" in ax.get_title()
    assert "1F1B)" not in ax.get_title()
    numbers = [t.get_text() for t in ax.texts]
    shown = shown_microbatches(p.pp, p.vpp, p.grad_accum)
    assert shown % p.pp == 0
    assert sorted(numbers, key=int) == sorted([str(k) for k in range(1, shown + 1)] * 2 * p.pp * p.vpp, key=int)
    assert all(c.get_edgecolor()[0][:3].tolist() == [0, 0, 0] for c in ax.collections)
    # top plans: % slower than the best from 0; the model's error band drawn, and the axis at least
    # that wide (a 0.2% spread is not stretched across the chart); labels all different
    from costmodel.uncertainty import relative_band
    ax = figs["Top plans"].axes[0]
    assert "% slower than the best" in ax.get_xlabel() and ax.get_xlim()[0] == 0
    steps = [s.estimate.step_time_s for s in info["solver"].solutions]
    spread = (max(steps) / min(steps) - 1) * 100
    band = relative_band("train-dense") * 100
    assert ax.get_xlim()[1] >= max(spread, band)
    shaded = [pt for pt in ax.patches if pt.get_x() == 0 and abs(pt.get_width() - band) < 1e-9]
    assert len(shaded) == 1, "the error band is not drawn"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == len(set(labels)), labels
    if spread <= band:
        assert "a tie" in ax.get_title()


@pytest.mark.parametrize("pp,vpp,m", [(2, 1, 8), (4, 1, 3), (2, 4, 8), (4, 2, 8), (4, 3, 4)])
def test_schedule_order_runs_every_pass_once(pp, vpp, m):
    """Each rank runs every (micro-batch, chunk) forward and backward once, a backward after its
    forward; interleaved, a rank warms up with (pp - rank - 1) x 2 + (vpp - 1) x pp forwards."""
    for rank in range(pp):
        seq = schedule_order(pp, vpp, m, rank)
        want = {(k, c) for k in range(m) for c in range(vpp)}
        assert sorted((k, c) for f, k, c in seq if f == "f") == sorted(want)
        assert sorted((k, c) for f, k, c in seq if f == "b") == sorted(want)
        pos = {(f, k, c): i for i, (f, k, c) in enumerate(seq)}
        assert all(pos[("f", k, c)] < pos[("b", k, c)] for k, c in want)
        if vpp > 1 and m > pp:
            warm = next(i for i, (f, _, _) in enumerate(seq) if f == "b") - 1
            assert warm == min(m * vpp, (pp - rank - 1) * 2 + (vpp - 1) * pp)


def test_interleaving_shrinks_the_drawn_bubble():
    """The same plan drawn interleaved (vpp=4) ends sooner than drawn 1F1B: the bubble the cost
    model prices as (pp - 1) / vpp is the one drawn."""
    import dataclasses

    from planner.cli.explain import _timeline
    plan, info = _info("llama-3-70b-64xh100")
    plan = _interleaved(plan)
    flat = plan.replace(parallel=dataclasses.replace(plan.parallel, vpp=1, schedule="1f1b"))
    end = lambda iv: max(s + n for f, b in iv for s, n, _ in f + b)   # noqa: E731
    busy = sum(n for s, n, _ in _timeline(plan, info["estimate"])[0][0] + _timeline(plan, info["estimate"])[0][1])
    assert end(_timeline(plan, info["estimate"])) < end(_timeline(flat, info["estimate"]))
    assert busy == pytest.approx(sum(n for f, b in _timeline(flat, info["estimate"])[:1] for s, n, _ in f + b))


def test_profile_report_figures_are_whole(tmp_path, monkeypatch):
    """The profile report's plots, from a synthetic CPU measurement (two nodes of two ranks: the
    topology plot titled with the rank/tier explanation that used to be cut off)."""
    import profiles.report as R
    from profiles.probe import ReplayNVML, probe
    from profiles.profile import analyze, write_outputs
    from test_profile_fit import DATA, _result

    pr = probe(ReplayNVML.from_file(DATA / "no_driver.json"), host="vm")
    res = _result("cpu", nodes=2, gpn=2, best_tflops=0.5, intra_bw=1.0 * 2**30, inter_bw=0.025 * 2**30)
    prof = analyze(pr, res, name=None, quick=True, started=time.time(), method="test")
    seen = []
    real_png = R._png

    def keep(fig):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        FigureCanvasAgg(fig)
        seen.append(fig)
        return real_png(fig)
    monkeypatch.setattr(R, "_png", keep)
    write_outputs(prof, tmp_path, report=True)
    assert len(seen) >= 3
    for fig in seen:
        title = fig.axes[0].get_title() or fig.get_suptitle()
        assert F.layout_problems(fig) == [], title
        assert F.ink_fraction(real_png(fig)) > 0.03, title
    assert any("tier joining each pair" in ax.get_title() for fig in seen for ax in fig.axes)


# --------------------------------------------------------------------------------------
# Headless Chromium: the page itself
# --------------------------------------------------------------------------------------

PROBE = """<script>window.addEventListener('load', function () {
  var d = document.documentElement;
  var r = {images: [].slice.call(document.images).map(function (i) {
             var b = i.getBoundingClientRect();
             return {alt: i.alt, complete: i.complete, nw: i.naturalWidth, nh: i.naturalHeight,
                     w: b.width, left: b.left, right: b.right}; }),
           scrollWidth: d.scrollWidth, clientWidth: d.clientWidth, height: d.scrollHeight};
  var p = document.createElement('pre'); p.id = 'probe'; p.textContent = JSON.stringify(r);
  document.body.appendChild(p); });</script>"""


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def render(page: Path, width: int = 1280) -> tuple[dict, Path]:
    """(layout measured in the page, a screenshot of the whole page) from headless Chromium."""
    exe = chromium()
    probed = page.with_suffix(".probe.html")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},1000",
             "--virtual-time-budget=5000"]
    r = subprocess.run(flags + ["--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="probe">(.*?)</pre>', r.stdout, re.S)
    assert m, f"chromium rendered no page: {r.stderr[-500:]}"
    layout = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    shot = page.with_suffix(".png")
    flags[5] = f"--window-size={width},{layout['height'] + 20}"
    subprocess.run(flags + [f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 0
    return layout, shot


def need_chromium() -> None:
    """Skip without Chromium; in CI (``SHARDPLAN_CI=1``, set by ``.ci/run``, which installs it) fail."""
    if chromium() is None:
        msg = "Chromium is not installed (apt-get install -y chromium; .ci/run does)"
        if os.environ.get("SHARDPLAN_CI"):
            pytest.fail(msg + ": in CI the page-rendering tests must run")
        pytest.skip(msg)


DATA_URI = re.compile(r"""src=['"]data:image/png;base64,([^'"]*)['"]""")


def embedded_images(page_html: str) -> list[bytes]:
    """Every image embedded in the page, decoded: base64 text of a PNG, nothing else (a Python
    bytes repr such as ``b'\x89PNG...'`` fails here)."""
    out = []
    for text in DATA_URI.findall(page_html):
        raw = base64.b64decode(text, validate=True)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n", "an embedded image is not a PNG"
        out.append(raw)
    return out


def check_images(page_html: str, images: int) -> list[tuple[int, int]]:
    """Decodes every embedded image; each is a PNG with something drawn. Returns their sizes (w, h)."""
    import matplotlib.image as mpimg
    pngs = embedded_images(page_html)
    assert len(pngs) == images == page_html.count("<img"), "an <img> is not a base64 PNG"
    sizes = []
    for raw in pngs:
        img = mpimg.imread(io.BytesIO(raw), format="png")
        assert F.ink_fraction(raw) > 0.03, "an embedded image is (nearly) blank"
        sizes.append((img.shape[1], img.shape[0]))
    return sizes


def check_height(layout: dict, sizes: list[tuple[int, int]], text_lines: int) -> None:
    """The page is no taller than its images (at their rendered width) and its text need: escaped
    bytes or a runaway table would make it so."""
    width = layout["clientWidth"]
    need = sum(h * min(1.0, width / w) for w, h in sizes) + 24 * text_lines + 400
    assert layout["height"] <= need, f"page is {layout['height']} px tall; its content needs at most {need:.0f}"
    assert layout["height"] >= sum(h * min(1.0, width / w) for w, h in sizes) * 0.6, "images drawn too small"


def check_page(layout: dict, shot: Path, images: int) -> None:
    assert len(layout["images"]) == images
    for im in layout["images"]:
        assert im["complete"] and im["nw"] > 0 and im["nh"] > 0, f"image {im['alt']!r} did not load"
        assert im["left"] >= 0 and im["right"] <= layout["clientWidth"] + 1, f"image {im['alt']!r} sticks out"
        assert im["w"] >= 0.6 * min(im["nw"], layout["clientWidth"]), f"image {im['alt']!r} squeezed"
    assert layout["scrollWidth"] <= layout["clientWidth"] + 1, "the page scrolls sideways"
    png = shot.read_bytes()
    assert F.ink_fraction(png) > 0.05, "the screenshot is (nearly) blank"
    # ink in every tenth of the page's height but the last: no blank stretch where a figure should be
    import matplotlib.image as mpimg
    img = mpimg.imread(io.BytesIO(png), format="png")[..., :3]
    h = img.shape[0]
    bands = [((img[k * h // 10:(k + 1) * h // 10] < 0.94).any(axis=-1)).mean() for k in range(9)]
    assert min(bands) > 0.005, f"blank bands in the screenshot: {[round(b, 3) for b in bands]}"


def _lines(page_html: str) -> int:
    text = re.sub(r"<img[^>]*>", "", page_html)
    return text.count("\n") + text.count("<tr") + text.count("<h") + text.count("<p")


def test_missing_chromium_fails_in_ci_and_skips_elsewhere(monkeypatch):
    import sys
    me = sys.modules[__name__]
    monkeypatch.setattr(me, "chromium", lambda: None)
    monkeypatch.setenv("SHARDPLAN_CI", "1")
    with pytest.raises(pytest.fail.Exception, match="in CI"):
        need_chromium()
    monkeypatch.delenv("SHARDPLAN_CI")
    with pytest.raises(pytest.skip.Exception):
        need_chromium()


def test_explain_page_renders_in_chromium(tmp_path):
    need_chromium()
    plan, info = _info("llama-3-70b-64xh100")
    page = tmp_path / "explain.html"
    page.write_text(html_report(plan, info))
    sizes = check_images(page.read_text(), images=4)
    layout, shot = render(page)
    check_page(layout, shot, images=4)
    check_height(layout, sizes, _lines(page.read_text()))


@functools.lru_cache(maxsize=None)
def _serving_page(tmp: str) -> str:
    """``planner plan --mode infer --pareto --out`` then ``planner explain --html``, in process."""
    from planner.cli import main
    plan_file, page = Path(tmp) / "serve.yaml", Path(tmp) / "serve.html"
    assert main(["plan", "--mode", "infer", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--prompt-len", "1000", "--output-len", "200", "--ttft-slo-ms", "400", "--tpot-slo-ms", "30",
                 "--pareto", "--out", str(plan_file)]) == 0
    assert main(["explain", str(plan_file), "--html", str(page)]) == 0
    return page.read_text()


def test_serving_page_embeds_a_decodable_frontier(tmp_path):
    """The serving report's frontier is base64 PNG text (it was Python's bytes repr: a broken image
    and 1,400 px of escaped bytes), and its table marks the chosen plan."""
    page = _serving_page(str(tmp_path))
    (w, h), = check_images(page, images=1)
    assert w >= 500 and h >= 400
    assert "b'" not in page and "\\x89" not in page
    assert page.count("class=chosen") == 1


def test_serving_page_renders_in_chromium(tmp_path):
    need_chromium()
    html_text = _serving_page(str(tmp_path))
    page = tmp_path / "serve.html"
    sizes = check_images(html_text, images=1)
    layout, shot = render(page)
    check_page(layout, shot, images=1)
    check_height(layout, sizes, _lines(html_text))


def test_profile_page_renders_in_chromium(tmp_path):
    need_chromium()
    from profiles.probe import ReplayNVML, probe
    from profiles.profile import analyze, write_outputs
    from test_profile_fit import DATA, _result

    pr = probe(ReplayNVML.from_file(DATA / "dgx_h100.json"), host="dgx")
    res = _result("cuda", nodes=2, gpn=8, best_tflops=700.0, intra_bw=360 * 2**30, inter_bw=45 * 2**30)
    prof = analyze(pr, res, name="h100-test", quick=False, started=time.time(), method="test")
    write_outputs(prof, tmp_path, report=True)
    page = tmp_path / "report.html"
    sizes = check_images(page.read_text(), images=4)
    layout, shot = render(page)
    check_page(layout, shot, images=4)
    check_height(layout, sizes, _lines(page.read_text()))
