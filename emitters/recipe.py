"""What an emitted training script carries besides the parallel layout: the model's own settings
(RoPE base and scaling, norm epsilon, tied embeddings, vocabulary), a documented optimizer
schedule, and the values a user must supply, marked and checked at the top of the script.

The schedule is GPT-3's (Brown et al., 2020, "Language Models are Few-Shot Learners"), the one
published recipe that gives a learning rate for eight model sizes from 125M to 175B parameters
(Table 2.1) with every other setting stated (Appendix B):

* peak learning rate: Table 2.1, interpolated log-log in the parameter count (active parameters
  for mixture-of-experts models: each token's update goes through those); clamped to the table's
  ends (6.0e-4 at 125M and below, 0.6e-4 at 175B and above);
* linear warmup over the first 375M tokens (or the first tenth of the run if that is shorter: a
  small test job would otherwise never leave warmup), then cosine decay to 10% of the peak over
  the run (the run's length is the user's: TRAIN_ITERS);
* AdamW with beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1, gradient clipping at norm 1.0.

Llama 2 (Touvron et al., 2023, section 2.2) uses the same shape (warmup, cosine to 10%, 0.1,
1.0, 0.9/0.95) with higher peaks (3e-4 at 7B, 1.5e-4 at 70B): the GPT-3 table is the more
conservative of the two. Weights start at a normal of std sqrt(2 / (5 * hidden)) (Nguyen and
Salazar, 2019, "Transformers without Tears"; GPT-NeoX's ``small_init``), not Megatron's 0.02,
which is wide for hidden sizes in the thousands.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from costmodel.frameworks import (attention_impl, backend_profile, curves_measured, framework_profile,
                                  kernel_efficiency_on)
from planner.plan.planfile import Plan
from emitters.base import one_line, sh

# (parameters, peak learning rate): GPT-3 Table 2.1
GPT3_LR = ((125e6, 6.0e-4), (350e6, 3.0e-4), (760e6, 2.5e-4), (1.3e9, 2.0e-4), (2.7e9, 1.6e-4),
           (6.7e9, 1.2e-4), (13e9, 1.0e-4), (175e9, 0.6e-4))
WARMUP_TOKENS = 375e6      # GPT-3 Appendix B
MIN_LR_RATIO = 0.1         # cosine decay to 10% of the peak (GPT-3 Appendix B; Llama 2 2.2)
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
BETA1, BETA2, ADAM_EPS = 0.9, 0.95, 1e-8


def _sig(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits}g}")


def peak_lr(params: float) -> float:
    """GPT-3 Table 2.1's learning rate for a model of ``params`` parameters (log-log between rows)."""
    if params <= GPT3_LR[0][0]:
        return GPT3_LR[0][1]
    for (n0, lr0), (n1, lr1) in zip(GPT3_LR, GPT3_LR[1:]):
        if params <= n1:
            t = math.log(params / n0) / math.log(n1 / n0)
            return _sig(math.exp(math.log(lr0) + t * math.log(lr1 / lr0)))
    return GPT3_LR[-1][1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    params: float              # parameters the learning rate is read at (active ones for MoE)
    lr: float
    min_lr: float
    warmup_steps: int
    weight_decay: float = WEIGHT_DECAY
    grad_clip: float = GRAD_CLIP
    beta1: float = BETA1
    beta2: float = BETA2
    eps: float = ADAM_EPS
    init_std: float = 0.02

    def comment(self, steps_var: str = "TRAIN_ITERS", warmup_var: str = "WARMUP_ITERS", init: bool = True) -> list[str]:
        """Lines for a script header saying what the schedule is and where it comes from
        (``warmup_var=""``: the script sets no warmup itself; the user's code does)."""
        over = f"; ${warmup_var} overrides" if warmup_var else ""
        end = f"at ${steps_var}" if steps_var else "at the run's last step"
        return ["Optimizer (GPT-3 recipe, Brown et al. 2020 Table 2.1 + Appendix B; see emitters/recipe.py):",
                f"  AdamW lr {sci(self.lr)} (Table 2.1 at {self.params / 1e9:.3g}B parameters), betas "
                f"{self.beta1}/{self.beta2}, eps {self.eps:g}, weight decay {self.weight_decay}, grad clip "
                f"{self.grad_clip};",
                f"  linear warmup {self.warmup_steps} steps (375M tokens; a tenth of the run if less{over}), "
                f"cosine decay to {sci(self.min_lr)} (10%) {end}"
                + (f"; init std {self.init_std:.3g} = sqrt(2 / (5 * hidden))." if init else ".")]


def recipe(plan: Plan) -> Recipe:
    m, w = plan.model, plan.workload
    params = float(m.active_params() if m.is_moe else m.total_params())
    lr = peak_lr(params)
    tokens_per_step = w.global_batch * w.seq_len
    return Recipe(params=params, lr=lr, min_lr=_sig(lr * MIN_LR_RATIO),
                  warmup_steps=max(1, math.ceil(WARMUP_TOKENS / tokens_per_step)),
                  init_std=_sig(math.sqrt(2 / (5 * m.hidden))))


def model_settings(plan: Plan) -> str:
    """The model's own settings in one line, for the headers of scripts whose model code is the user's."""
    m = plan.model
    parts = [f"{m.layers} layers, hidden {m.hidden}, ffn {m.ffn_hidden}, {m.heads} heads"
             + (f" ({m.kv_heads} KV heads)" if m.kv_heads < m.heads else ""),
             f"vocab {m.vocab}", "SwiGLU" if m.mlp == "swiglu" else "GELU MLP",
             f"{'RMSNorm' if m.norm == 'rmsnorm' else 'LayerNorm'} eps {m.norm_eps:g}",
             "tied embeddings" if m.tied_embeddings else "untied embeddings"]
    if m.positions == "rotary":
        parts.append(f"RoPE theta {m.rope_theta:g}"
                     + (f", Llama 3.1 scaling x{m.rope_scaling:g}" if m.rope_scaling else ", no RoPE scaling"))
    else:
        parts.append(f"{m.positions} positions")
    return f"Model {m.name}: " + ", ".join(parts)


PRICED_TAG = "priced-assumptions:"


def priced_assumptions(plan: Plan, target: str, engine_facts: Sequence[str] = ()) -> list[str]:
    """Header lines naming what the plan's price rests on that no flag of the file sets: the
    framework's kernel speed and memory headroom (``costmodel.frameworks``), the attention kernel,
    and facts of the engine the file starts. The first line is ``key=value`` words after
    ``PRICED_TAG`` (tests/test_priced_is_written.py reads it back)."""
    fw = backend_profile(framework_profile(target), plan.parallel)   # Accelerate: the engine it hands the run to
    out = [f"{PRICED_TAG} kernel_efficiency={kernel_efficiency_on(fw, plan.cluster.gpu.name, curves_measured(plan.cluster))!r} "
           f"memory_headroom_fraction={fw.memory_headroom_fraction!r} attention_kernel={plan.workload.attention_kernel} "
           f"elementwise={fw.elementwise} attention_impl={attention_impl(fw, plan.parallel, plan.model.family) or '-'} "
           f"launch={fw.launch} dp_bucket={fw.dp_bucket}",
           f"(no flag sets these: {target}'s kernels relative to the cluster's GEMM efficiency curve"
           + (" (fitted on its published runs)" if fw.calibrated else " (not calibrated)")
           + ", the memory the allocator leaves unusable, the attention kernel the model code calls, "
           "how its memory-bound kernels run (fused, eager or compiled), the attention implementation its "
           "model code calls (costmodel/attention.py; - for the GEMM-curve rule), how the host issues a layer's "
           "kernels (costmodel/host.py) and the data-parallel bucket the framework defaults to "
           "(costmodel/stage_terms.py dp_bucket_bytes); "
           "costmodel/frameworks.py)"]
    out += list(engine_facts)
    return out


# --------------------------------------------------------------------------------------
# Values a user supplies: marked at the top of a script, checked before anything starts
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Need:
    """One value the user supplies as an environment variable.

    ``kind``: ``set`` (non-empty), ``int`` (a positive integer, above ``more_than`` if given),
    ``file``/``dir`` (exists), ``cmd`` (``var`` is a command that must be on PATH; nothing to set),
    ``py`` (``var`` is a module that ``$PYTHON`` (default python3) must find; nothing to set).
    ``unless``: another variable that, when set, makes this one unnecessary (e.g. MOCK_DATA).
    """
    var: str
    what: str
    kind: str = "set"
    unless: str = ""
    more_than: int | str = 0   # for int: a number or shell text ("${WARMUP_ITERS:-716}")
    path_in: str = ""          # for file/dir: the path is "$var/<path_in>"


def checkpoint_need(how: str) -> Need:
    """``CHECKPOINT_DIR``, asked for by every training script: a run that saves nothing cannot resume."""
    return Need("CHECKPOINT_DIR", f"the folder the run's checkpoints go to, on storage every node sees ({how})")


def needs_block(script: str, needs: Sequence[Need]) -> str:
    """Bash: the list of values to supply, then a check of each (exit 2 with what to set)."""
    lines = ["# ---- what you supply (each is checked below; exit 2 says what is missing) ----"]
    width = max(len(n.var) for n in needs)
    for n in needs:
        opt = f" (not needed with {n.unless}=1)" if n.unless else ""
        kind = {"cmd": "on PATH: ", "py": "importable: "}.get(n.kind, "")
        lines.append(f"#   {n.var.ljust(width)}  {kind}{one_line(n.what)}{opt}")
    out = "\n".join(lines) + "\n"
    out += (f'stop() {{ echo "{script}: $*" >&2; exit 2; }}\n'
            'need() { [ -n "${!1:-}" ] || stop "set $1 to $2"; }\n')
    groups: list[tuple[str, list[str]]] = []
    for n in needs:
        checks = _checks(n)
        if groups and groups[-1][0] == n.unless:
            groups[-1][1].extend(checks)
        else:
            groups.append((n.unless, checks))
    for unless, checks in groups:
        if unless:
            out += f'if [ -z "${{{unless}:-}}" ]; then\n' + "".join(f"  {c}\n" for c in checks) + "fi\n"
        else:
            out += "".join(f"{c}\n" for c in checks)
    return out


def _checks(n: Need) -> list[str]:
    if n.kind == "cmd":
        return [f'command -v {n.var} >/dev/null 2>&1 || stop "{n.var} is not on PATH:" {sh(n.what)}']
    if n.kind == "py":
        return [f'"${{PYTHON:-python3}}" -c \'import importlib.util as u, sys; sys.exit(u.find_spec("{n.var}") is None)\' '
                f'2>/dev/null || stop "${{PYTHON:-python3}} cannot import {n.var}:" {sh(n.what)}']
    # what the user supplies may name the model (from a file): single-quoted, one line
    out = [f'need {n.var} {sh(one_line(n.what))}']
    if n.kind == "int":
        out.append(f'[[ "${n.var}" =~ ^[0-9]+$ ]] && [ "${n.var}" -gt "{n.more_than}" ] || '
                   f'stop "{n.var} must be an integer above {n.more_than}, got ${n.var}"')
    elif n.kind in ("file", "dir"):
        path = f'${n.var}/{n.path_in}' if n.path_in else f'${n.var}'
        out.append(f'[ {"-f" if n.kind == "file" else "-d"} "{path}" ] || stop "{n.var}: no {n.kind} {path}"')
    return out


def warmup_shell(r: Recipe, steps_var: str = "TRAIN_ITERS", warmup_var: str = "WARMUP_ITERS") -> str:
    """Bash that sets the warmup steps (375M tokens, at most a tenth of the run) once the run's
    length is checked, and refuses a warmup as long as the run."""
    w = r.warmup_steps
    return (f'{warmup_var}="${{{warmup_var}:-$(( {steps_var} / 10 < {w} ? ({steps_var} / 10 > 0 ? {steps_var} / 10 : 1) '
            f': {w} ))}}"  # 375M tokens = {w} steps, or a tenth of the run (at least 1: DeepSpeed refuses 0)\n'
            f'[[ "${warmup_var}" =~ ^[0-9]+$ ]] && [ "${warmup_var}" -lt "${steps_var}" ] || '
            f'stop "{warmup_var} must be an integer below {steps_var} (${steps_var}), got ${warmup_var}"\n')


def sci(x: float) -> str:
    """A learning rate as people write it: 1.14e-04."""
    return f"{x:.2e}"
