"""Running ``planner`` in this process (``planner.cli.main``) for the input tests: the exit code,
stdout and stderr of one command, a hang turned into a failure by an alarm, and the checks
every answer must pass (exit 0 with finite, physically possible numbers; exit 2 with one line;
never a traceback, never exit 70)."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Any

from planner.cli import main


class Hang(Exception):
    pass


@dataclass
class Result:
    argv: list[str]
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def where(self) -> str:
        return f"planner {' '.join(self.argv)}\nexit {self.code}\nstderr: {self.err[-2000:]}\nstdout: {self.out[:500]}"


def _alarm(signum, frame):
    raise Hang("no answer within the time limit")


def _event(code: int, err: str) -> None:
    """For ``--hypothesis-show-statistics``: how often each exit code came (with FUZZ_DEBUG=1, and
    which message, numbers blanked)."""
    try:
        from hypothesis import event
    except ImportError:
        return
    msg = ""
    if os.environ.get("FUZZ_DEBUG") and err:
        msg = ": " + re.sub(r"[0-9.]+", "N", err.split(": error: ")[-1][:90])
    try:
        event(f"exit {code}{msg}")
    except Exception:          # outside a hypothesis test
        pass


def run(argv: list[str], timeout_s: int = 20) -> Result:
    """``planner ARGV`` in process; a command that runs past ``timeout_s`` raises ``Hang``."""
    out, err = io.StringIO(), io.StringIO()
    outer = signal.alarm(0)              # pytest-timeout's alarm, if any: put back afterwards
    old = signal.signal(signal.SIGALRM, _alarm)
    t0 = time.monotonic()
    signal.alarm(timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as e:               # argparse
                code = e.code if isinstance(e.code, int) else 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        if outer:
            signal.alarm(max(1, outer - int(time.monotonic() - t0)))
    _event(code, err.getvalue())
    return Result([str(a) for a in argv], code, out.getvalue(), err.getvalue())


def finite_tree(x: Any, path: str = "") -> None:
    """Every number in a JSON document is finite."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return
    if isinstance(x, (int, float)):
        assert math.isfinite(x), f"{path} = {x}"
    elif isinstance(x, dict):
        for k, v in x.items():
            finite_tree(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            finite_tree(v, f"{path}[{i}]")


def check_training_estimate(est: dict, attention_kernel: str = "flash") -> None:
    """The physics of a training estimate (``planner estimate --json``'s ``estimate``)."""
    finite_tree(est, "estimate")
    assert est["step_time_s"] > 0 and est["tokens_per_s"] > 0 and est["tokens_per_s_per_gpu"] > 0, est
    assert 0 < est["mfu"] <= est["hfu"] + 1e-12, (est["mfu"], est["hfu"])
    # Executed FLOPs cannot outrun the peak. MFU and HFU count attention over the full score
    # matrix (as the papers do); a materialized kernel computes all of it, so both stay below 1;
    # a causal flash kernel computes half, so under that convention they stay below 2.
    bound = 1.0 if attention_kernel == "materialized" else 2.0
    assert est["hfu"] < bound, (est["mfu"], est["hfu"], attention_kernel)
    mem = est["memory"]
    assert mem["peak_bytes"] > 0 and all(v >= 0 for v in mem.values()), mem
    assert est["memory_capacity_bytes"] > 0
    t = est["time"]
    assert all(v >= 0 for v in t.values()), t
    assert math.isclose(sum(t.values()), est["step_time_s"], rel_tol=1e-6), (t, est["step_time_s"])


def check_training_uncertainty(u: dict, est: dict) -> None:
    """A training prediction's ``uncertainty``: its range holds the prediction, the causal MFU (the
    ceilings' count, the causal mask's skipped half of attention left out) is at most the full one and
    under the peak, and the step at the ceiling exists exactly when the MFU flag does, and is slower."""
    lo, hi = u["step_time_s_range"]
    assert lo <= est["step_time_s"] <= hi, (u, est["step_time_s"])
    assert 0 < u["mfu_causal"] <= est["mfu"] + 1e-12 and u["mfu_causal"] < 1.0, (u["mfu_causal"], est["mfu"])
    assert (u["ceiling_step_s"] is None) is (u["mfu_flag"] is None), u
    if u["ceiling_step_s"] is not None:
        assert u["ceiling_step_s"] > est["step_time_s"] and u["mfu_causal"] > u["mfu_ceiling"], u


def check_serving_estimate(est: dict) -> None:
    finite_tree(est, "estimate")
    assert est["ttft_s"] > 0 and est["tpot_s"] > 0, est
    assert est["output_tokens_per_s_per_gpu"] > 0, est
    assert all(v >= 0 for v in est["memory"].values()), est["memory"]


def check_refusal(r: Result, codes: tuple[int, ...] = (2,)) -> None:
    """A refusal: an expected exit code and one line on stderr, no traceback."""
    assert r.code in codes, r.where()
    assert "Traceback" not in r.err and "internal error" not in r.err, r.where()
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].strip(), r.where()


def check_answer(r: Result, ok_codes: tuple[int, ...] = (0,), refusal_codes: tuple[int, ...] = (2,),
                 attention_kernel: str = "flash") -> None:
    """Exit 0 with a physically possible --json answer, or a one-line refusal. Never 70."""
    assert r.code != 70 and "Traceback" not in r.err, r.where()
    if r.code in ok_codes and r.code == 0:
        d = r.json()
        finite_tree(d)
        plans = d["plans"] if "plans" in d else [d]
        for p in plans:
            est = p["estimate"]
            if "ttft_s" in est:
                check_serving_estimate(est)
            else:
                check_training_estimate(est, attention_kernel)
                if "uncertainty" in p:
                    check_training_uncertainty(p["uncertainty"], est)
        return
    check_refusal(r, refusal_codes + tuple(c for c in ok_codes if c != 0))
