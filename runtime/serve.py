"""Serve a plan: ``python -m runtime.serve --plan PLAN [--prompt-len P --output-len O] ...``.

Greedy generation with a KV cache for an inference plan (mode ``infer``), tensor parallel,
pipeline parallel and expert parallel across processes, data-parallel replicas side by side. Under torchrun it
reads ``RANK``/``WORLD_SIZE`` and joins the process group (NCCL on GPUs, gloo on CPUs); a
one-process plan also runs without torchrun.

    python -m runtime.serve --plan PLAN [--prompt-len P] [--output-len O] [--batch B]
        [--json-out FILE] [--device auto|cpu|cuda] [--warmup N] [--quiet]

What runs. The mesh is the plan's order without ``cp`` (``pp, dp, tp`` by default). Each rank
builds its pipeline stage of the model (``runtime.model``, the same modules training uses, the
same deterministic initial weights from the workload seed), applies tensor parallel from
``runtime.parallel.tp_plan`` (Megatron column/row splits, vocab-parallel embedding and head),
and generates with its own forward (``StageRunner``): the model's blocks never see a cache, so
attention is re-done here on the block's own projections with a per-layer cache of the
rank's K/V heads, rotary positions offset by the cache length. Replica ``r`` serves rows
``r*B .. (r+1)*B`` of the prompts the workload's token stream gives for step 0 (the seed fixes
them), so any split of one workload generates from the same prompts.

Expert parallel (``ep > 1``, vLLM's EP = TP x DP): each MoE layer's experts are spread over the
``ep`` ranks of ``ep / tp`` neighbouring replicas (whole experts, ``E / ep`` per rank, sliced from
the same deterministic weights), attention stays data parallel. A replica's TP ranks hold the
same hidden states, so each dispatches ``1 / tp`` of the routed token copies to the ranks owning
their experts (all-to-all over the EP group, ``runtime.parallel.AllToAllDispatch``) and the TP
group gathers the results (``EpDispatch``); the replicas of an EP group step together.

A step: stage 0 embeds the new tokens, each stage runs its layers and sends the hidden states
to the next (point-to-point between ranks with the same ``dp, tp`` coordinates), the last stage
takes the argmax of the last position's logits (gathered over TP) and broadcasts the tokens to
its pipeline group. The first step is the prefill of the whole prompt; each later one decodes
one token per sequence.

Measured (rank 0): time to first token of the batch (the prefill of all B prompts at once:
the static-batch TTFT, which ``estimate.time.prefill_batch_s`` predicts), time per output token
(median decode step), output tokens/s; printed and written by ``--json-out`` beside the plan's
prediction. Exit codes: 0 done; 2 a plan or input this runtime cannot use (one line, no
traceback).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import worker
from .errors import PlanNotRunnable, RuntimeModelError, RuntimeUsageError  # noqa: F401


@dataclass
class ServeOptions:
    prompt_len: int = 0          # 0 -> the plan's
    output_len: int = 0          # 0 -> the plan's
    batch: int = 0               # sequences per replica; 0 -> the plan's (workload.global_batch)
    json_out: str = ""
    device: str = "auto"
    warmup: int = 1              # untimed generations of 2 tokens before the measured one
    quiet: bool = False


# --------------------------------------------------------------------------------------
# Checks (no torch needed)
# --------------------------------------------------------------------------------------

def lengths(plan, opts: ServeOptions) -> tuple[int, int, int]:
    """(prompt_len, output_len, batch per replica), from the options or the plan."""
    w = plan.workload
    P = opts.prompt_len or w.prompt_len or w.seq_len
    O = opts.output_len or w.output_len or 1
    B = opts.batch or w.global_batch
    for name, v in (("--prompt-len", P), ("--output-len", O), ("--batch", B)):
        if v < 1:
            raise RuntimeUsageError(f"{name} must be >= 1, got {v}")
    if P + O > plan.model.max_seq_len:
        raise RuntimeUsageError(f"prompt {P} + output {O} = {P + O} tokens exceeds {plan.model.name}'s "
                                f"max_seq_len {plan.model.max_seq_len}")
    return P, O, B


def check_plan(plan, world: int | None) -> None:
    """What this runtime can serve; every problem with its numbers."""
    from costmodel.specs import kv_heads_shard
    spec, par = plan.model, plan.parallel
    problems = []
    if plan.mode != "infer":
        raise RuntimeUsageError(f"the plan is a {plan.mode!r} plan; runtime.serve serves inference plans "
                                "(mode infer; `planner plan --mode infer`)")
    if world is not None and world != par.world_size:
        problems.append(f"the plan needs tp*pp*replicas = {par.tp}*{par.pp}*{par.dp} = {par.world_size} "
                        f"processes but the launch has {world}")
    if par.cp != 1 or par.vpp != 1:
        problems.append(f"cp {par.cp} / vpp {par.vpp}: serving runs cp=1, vpp=1")
    if par.ep != 1:
        if not spec.is_moe or spec.num_experts % par.ep:
            problems.append(f"ep {par.ep} must divide the experts of {spec.name} ({spec.num_experts})")
        if par.ep % par.tp or (par.tp * par.dp) % par.ep:
            problems.append(f"ep {par.ep} must be a multiple of tp {par.tp} dividing tp*replicas = {par.tp * par.dp} "
                            "(whole experts over the GPUs of ep/tp replicas)")
    if (plan.serving or {}).get("disaggregation"):
        problems.append("disaggregated prefill/decode pools: the built-in runtime serves aggregated replicas "
                        "(emit the plan for vllm or sglang)")
    if spec.heads % par.tp or not kv_heads_shard(spec, par.tp):
        problems.append(f"tp {par.tp} must divide heads {spec.heads} and kv_heads {spec.kv_heads} (the runtime "
                        "shards K/V heads; it does not replicate them)")
    if spec.ffn_hidden % par.tp or (spec.is_moe and spec.expert_ffn_hidden % par.tp):
        problems.append(f"tp {par.tp} does not divide the FFN width")
    if spec.positions == "learned" and spec.max_seq_len % par.tp:
        problems.append(f"tp {par.tp} does not divide max_seq_len {spec.max_seq_len} (learned positions are "
                        "sharded like the vocabulary)")
    if len(plan.stages) != par.pp:
        problems.append(f"{len(plan.stages)} stages for pp {par.pp}")
    if problems:
        raise PlanNotRunnable("; ".join(problems))


# --------------------------------------------------------------------------------------
# One pipeline stage with a KV cache
# --------------------------------------------------------------------------------------


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class StageRunner:
    """The layers of one pipeline stage (and the embedding / head it owns) with a KV cache."""

    def __init__(self, part, spec, batch: int, max_len: int, device, dtype):
        import torch
        self.part, self.spec = part, spec
        self.cache: dict[str, tuple[Any, Any]] = {}
        for key, blk in part.layers.items():
            kvh = blk.attention.wk.weight.shape[0] // spec.head_dim
            if hasattr(blk.attention.wk.weight, "to_local"):
                kvh = _local(blk.attention.wk.weight).shape[0] // spec.head_dim
            shape = (batch, max_len, kvh, spec.head_dim)
            self.cache[key] = (torch.zeros(shape, device=device, dtype=dtype),
                               torch.zeros(shape, device=device, dtype=dtype))

    def embed(self, tokens, start: int):
        import torch
        e = self.part.embed
        h = e.tok(tokens)
        if e.pos is not None:
            pos = torch.arange(start, start + tokens.shape[1], device=tokens.device)[None, :]
            h = h + e.pos(pos)
        return _local(h)

    def _attention(self, attn, x, key: str, start: int):
        import torch.nn.functional as F
        from runtime.model import ROPE_THETA, rope
        b, s = x.shape[0], x.shape[1]
        hd = self.spec.head_dim
        q = _local(attn.wq(x)).view(b, s, -1, hd)
        k = _local(attn.wk(x)).view(b, s, -1, hd)
        v = _local(attn.wv(x)).view(b, s, -1, hd)
        if attn.rotary:
            q, k = rope(q, k, ROPE_THETA, start)
        kc, vc = self.cache[key]
        kc[:, start:start + s] = k
        vc[:, start:start + s] = v
        K, V = kc[:, :start + s], vc[:, :start + s]
        rep = q.shape[2] // K.shape[2]
        if rep > 1:
            K = K.repeat_interleave(rep, dim=2)
            V = V.repeat_interleave(rep, dim=2)
        # prefill from an empty cache: causal; one new token: it sees the whole cache
        o = F.scaled_dot_product_attention(q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2),
                                           is_causal=s > 1)
        if s > 1 and start:
            raise AssertionError("chunked prefill on a non-empty cache is not implemented")
        return _local(attn.wo(o.transpose(1, 2).reshape(b, s, -1)))

    def layers(self, h, start: int):
        for key, blk in self.part.layers.items():
            h = h + self._attention(blk.attention, blk.attention_norm(h), key, start)
            ff = blk.moe if blk.moe is not None else blk.feed_forward
            h = h + _local(ff(blk.ffn_norm(h)))
        return h

    def next_tokens(self, h):
        """Greedy: the argmax of the last position's logits (gathered over the vocabulary shards),
        and the winning logit (a fine-grained check that two splits computed the same thing)."""
        logits = self.part.output(self.part.norm(h[:, -1:]))
        if hasattr(logits, "full_tensor"):
            logits = logits.full_tensor()
        top = logits.float().max(dim=-1)
        return top.indices, top.values                     # [batch, 1] each


class EpDispatch:
    """Serving expert parallel (module docstring): this TP rank's ``1 / tp`` of the routed copies
    (sorted by expert) go over the EP group's all-to-all; the TP group gathers every rank's part
    back into the order it came in."""

    def __init__(self, ep_group, ep: int, num_experts: int, tp_group, tp: int, tp_rank: int):
        from .parallel import AllToAllDispatch
        self.a2a = AllToAllDispatch(ep_group, ep, num_experts)
        self.tp_group, self.tp, self.tp_rank = tp_group, tp, tp_rank

    def __call__(self, experts, xs, counts):
        import torch
        import torch.distributed as dist
        if self.tp == 1:
            return self.a2a(experts, xs, counts)
        n = xs.shape[0]
        bounds = [n * r // self.tp for r in range(self.tp + 1)]
        lo, hi = bounds[self.tp_rank], bounds[self.tp_rank + 1]
        end = torch.cumsum(counts, 0)
        start = end - counts
        mine = (end.clamp(lo, hi) - start.clamp(lo, hi)).to(counts.dtype)     # my copies of each expert
        ys = self.a2a(experts, xs[lo:hi], mine)
        width = max(b - a for a, b in zip(bounds, bounds[1:]))
        pad = ys.new_zeros((width, ys.shape[-1]))
        pad[:hi - lo] = ys
        parts = [torch.empty_like(pad) for _ in range(self.tp)]
        dist.all_gather(parts, pad, group=self.tp_group)
        return torch.cat([parts[r][:bounds[r + 1] - bounds[r]] for r in range(self.tp)])


# --------------------------------------------------------------------------------------
# The server: mesh, stage, generation
# --------------------------------------------------------------------------------------

class Server:
    def __init__(self, plan, opts: ServeOptions, device_type: str, rank: int, world: int):
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from .model import build_model, init_weights
        from .parallel import apply_experts, apply_tp

        self.plan, self.opts, self.rank, self.world = plan, opts, rank, world
        spec, par = plan.model, plan.parallel
        self.spec, self.par = spec, par
        self.P, self.O, self.B = lengths(plan, opts)
        self.device_type = device_type
        cuda = device_type == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        # CPU: fp32 (exact comparisons between splits); GPU: the plan's 16-bit dtype
        w = plan.workload.dtype
        self.dtype = (torch.float16 if w in ("fp16", "float16") else torch.bfloat16) \
            if device_type == "cuda" else torch.float32
        order = [d for d in plan.mesh_order if d != "cp"]
        sizes = {"pp": par.pp, "dp": par.dp, "tp": par.tp}
        self.mesh = mesh = init_device_mesh(device_type, tuple(sizes[d] for d in order), mesh_dim_names=tuple(order))
        self.pp_rank = mesh["pp"].get_local_rank()
        self.dp_rank = mesh["dp"].get_local_rank()
        self.tp_rank = mesh["tp"].get_local_rank()
        self.pp_group = mesh["pp"].get_group()
        self.pp_ranks = dist.get_process_group_ranks(self.pp_group) if par.pp > 1 else [rank]
        self.first, self.last = self.pp_rank == 0, self.pp_rank == par.pp - 1
        st = plan.stages[self.pp_rank]
        with torch.device("meta"):
            part = build_model(spec, layers=range(st.first_layer, st.last_layer), embed=self.first, head=self.last)
        if par.tp > 1:
            apply_tp(part, mesh["tp"], spec, sp=False)
            if spec.is_moe and par.ep == 1:
                from types import SimpleNamespace
                apply_experts(part, mesh, SimpleNamespace(ep=1, tp=par.tp))
        part.to_empty(device=self.device)
        part.retie()
        init_weights([part], plan.workload.seed, spec)
        part.to(self.dtype)
        part.eval()
        self.part = part
        self._dist = dist
        if par.ep > 1:
            self._apply_ep()

    def _apply_ep(self) -> None:
        """Expert parallel over ep/tp neighbouring replicas (module docstring): the EP groups
        (every rank makes every group, in one order), this rank's slice of each MoE layer's
        experts, and the dispatcher."""
        import torch.nn as nn
        par, dist = self.par, self._dist
        g = par.ep // par.tp
        names = list(self.mesh.mesh_dim_names)
        layout = self.mesh.mesh.permute(names.index("pp"), names.index("dp"), names.index("tp"))
        mine = None
        for p in range(par.pp):
            for b in range(par.dp // g):
                ranks = [int(r) for r in layout[p, b * g:(b + 1) * g, :].reshape(-1)]
                grp = dist.new_group(ranks)
                if self.rank in ranks:
                    mine, self.ep_rank = grp, ranks.index(self.rank)
        local = self.spec.num_experts // par.ep
        lo = self.ep_rank * local
        dispatch = EpDispatch(mine, par.ep, self.spec.num_experts, self.mesh["tp"].get_group() if par.tp > 1 else None,
                              par.tp, self.tp_rank)
        for blk in self.part.layers.values():
            moe = getattr(blk, "moe", None)
            if moe is None:
                continue
            ex = moe.experts
            for n in ("w1", "w2", "w3", "b1", "b2", "b3"):
                t = getattr(ex, n)
                if t is not None:
                    setattr(ex, n, nn.Parameter(t.data[lo:lo + local].clone(), requires_grad=False))
            moe.dispatch = dispatch

    # ---- communication ------------------------------------------------------------------
    def _send_next(self, h) -> None:
        self._dist.send(h.contiguous(), dst=self.pp_ranks[self.pp_rank + 1])

    def _recv_prev(self, shape):
        import torch
        h = torch.empty(shape, device=self.device, dtype=self.dtype)
        self._dist.recv(h, src=self.pp_ranks[self.pp_rank - 1])
        return h

    def _share_tokens(self, tok):
        """The last stage's tokens to every stage of the pipeline."""
        if self.par.pp > 1:
            self._dist.broadcast(tok, src=self.pp_ranks[-1], group=self.pp_group)
        return tok

    def _sync(self) -> None:
        if self.device_type == "cuda":
            import torch
            torch.cuda.synchronize()

    # ---- generation ----------------------------------------------------------------------
    def prompts(self):
        """This replica's prompts: rows of step 0 of the workload's token stream."""
        from .data import TokenStream
        stream = TokenStream(global_batch=self.par.dp * self.B, seq_len=self.P - 1, vocab=self.spec.vocab,
                             seed=self.plan.workload.seed)
        rows = stream.batch(0)
        return rows[self.dp_rank * self.B:(self.dp_rank + 1) * self.B].to(self.device)

    def _step(self, runner: StageRunner, tokens, start: int):
        """One forward of ``tokens`` (on stage 0; others receive hidden states) at cache offset
        ``start``; returns the next tokens on every stage of the pipeline."""
        import torch
        b, s = tokens.shape
        if self.first:
            h = runner.embed(tokens, start)
        else:
            h = self._recv_prev((b, s, self.spec.hidden))
        h = runner.layers(h, start)
        if not self.last:
            self._send_next(h)
            tok = torch.empty((b, 1), dtype=torch.int64, device=self.device)
            val = torch.empty((b, 1), dtype=torch.float32, device=self.device)
        else:
            tok, val = runner.next_tokens(h)
            tok, val = tok.to(torch.int64).contiguous(), val.contiguous()
        return self._share_tokens(tok), self._share_tokens(val)

    def generate(self, prompts, output_len: int) -> tuple[Any, Any, float, list[float]]:
        """Greedy generation: (tokens [B, O], their logits [B, O], seconds to the first token,
        decode step times)."""
        import torch
        runner = StageRunner(self.part, self.spec, prompts.shape[0], prompts.shape[1] + output_len, self.device,
                             self.dtype)
        out, vals = [], []
        with torch.no_grad():
            self._dist.barrier()
            t0 = time.perf_counter()
            tok, val = self._step(runner, prompts, 0)
            self._sync()
            ttft = time.perf_counter() - t0
            out.append(tok)
            vals.append(val)
            steps = []
            pos = prompts.shape[1]
            for _ in range(output_len - 1):
                t = time.perf_counter()
                tok, val = self._step(runner, tok, pos)
                self._sync()
                steps.append(time.perf_counter() - t)
                out.append(tok)
                vals.append(val)
                pos += 1
        return torch.cat(out, dim=1), torch.cat(vals, dim=1), ttft, steps

    def gather_replicas(self, tokens):
        """Every replica's tokens on every rank, in replica order: [replicas * B, O]."""
        import torch
        if self.world == 1:
            return tokens
        parts = [torch.empty_like(tokens) for _ in range(self.world)]
        self._dist.all_gather(parts, tokens.contiguous())
        layout = self.mesh.mesh
        names = self.mesh.mesh_dim_names
        idx = [0] * len(names)
        rows = []
        for r in range(self.par.dp):
            idx[names.index("dp")] = r
            rows.append(parts[int(layout[tuple(idx)])])
        return torch.cat(rows)


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------

def _log(opts: ServeOptions, rank: int, msg: str) -> None:
    if rank == 0 and not opts.quiet:
        print(f"serve: {msg}", file=sys.stderr, flush=True)


def predicted(plan, P: int, O: int, B: int) -> dict[str, Any]:
    """The plan's prediction; recomputed by the cost model when the lengths or batch differ, or when
    the plan's figures assume continuous batching."""
    w = plan.workload
    est = dict(plan.estimate or {})
    # this runtime serves static batches: an in-flight or disaggregated plan's figures are not the
    # ones it can reproduce, so its prediction is the static model's at the same batch
    static = est.get("batching", "static") == "static"
    if (P, O, B) != (w.prompt_len, w.output_len, w.global_batch) or "tpot_s" not in est or not static:
        import dataclasses

        from costmodel.inference import estimate_inference
        from costmodel.specs import SpecError
        wl = dataclasses.replace(w, prompt_len=P, output_len=O, seq_len=P + O, global_batch=B, mode="infer")
        try:
            est = estimate_inference(plan.model, plan.cluster, wl, plan.parallel, stages=plan.stages).to_dict(False)
        except SpecError as e:
            return {"error": str(e)}
    t = est.get("time") or {}
    return {"ttft_s": est.get("ttft_s"), "prefill_batch_s": t.get("prefill_batch_s"), "tpot_s": est.get("tpot_s"),
            "output_tokens_per_s": est.get("output_tokens_per_s")}


def serve(plan, opts: ServeOptions) -> dict[str, Any]:
    """Run ``plan`` in this process (one rank). Joins (or makes) the process group unless one
    exists. Returns the summary (the same on every rank)."""
    from .train import _device_type, init_distributed
    torch_loaded = "torch" in sys.modules and sys.modules["torch"].distributed.is_initialized()
    world = (sys.modules["torch"].distributed.get_world_size() if torch_loaded
             else int(os.environ.get("WORLD_SIZE", "1")))
    check_plan(plan, world)
    P, O, B = lengths(plan, opts)
    if opts.warmup < 0:
        raise RuntimeUsageError(f"--warmup must be >= 0, got {opts.warmup}")
    device_type = _device_type(opts.device)
    rank, world = init_distributed(device_type)
    t_setup = time.perf_counter()
    srv = Server(plan, opts, device_type, rank, world)
    setup_s = time.perf_counter() - t_setup
    prompts = srv.prompts()
    for _ in range(opts.warmup):
        srv.generate(prompts, min(2, O))
    tokens, logits, ttft, steps = srv.generate(prompts, O)
    all_tokens = srv.gather_replicas(tokens)
    all_logits = srv.gather_replicas(logits)
    tpot = statistics.median(steps) if steps else None
    total = ttft + sum(steps)
    summary: dict[str, Any] = {
        "tokens": all_tokens.cpu().tolist(),
        "token_logits": all_logits.cpu().tolist(),
        "prompt_len": P, "output_len": O, "batch": B, "replicas": plan.parallel.dp,
        "ttft_s": ttft, "tpot_s": tpot, "decode_step_s": steps,
        "output_tokens_per_s": plan.parallel.dp * B * O / total if total > 0 else None,
        "predicted": predicted(plan, P, O, B),
        "world_size": world, "device": device_type, "dtype": str(srv.dtype).replace("torch.", ""),
        "parallel": plan.parallel.to_dict(), "setup_s": setup_s,
    }
    if plan.model.is_moe:      # the experts this rank holds (E / ep under expert parallel)
        summary["experts_per_rank"] = next((int(b.moe.experts.w1.shape[0]) for b in srv.part.layers.values()
                                            if getattr(b, "moe", None) is not None), 0)
    _log(opts, rank, f"{plan.model.name} tp={plan.parallel.tp} pp={plan.parallel.pp} replicas={plan.parallel.dp}: "
                     f"TTFT {ttft * 1e3:.2f} ms, TPOT {(tpot or 0) * 1e3:.2f} ms measured; predicted "
                     f"{_ms(summary['predicted'].get('prefill_batch_s'))} / {_ms(summary['predicted'].get('tpot_s'))}")
    if rank == 0 and opts.json_out:
        worker.write_json(opts.json_out, summary)
    return summary


def _ms(v) -> str:
    return f"{v * 1e3:.2f} ms" if isinstance(v, (int, float)) else "n/a"


# --------------------------------------------------------------------------------------
# For `planner launch` (no torch import: the CLI must start fast)
# --------------------------------------------------------------------------------------

def launch_module_args(plan_path: str, device: str, json_out: str, prompt_len: int = 0, output_len: int = 0,
                       batch: int = 0) -> list[str]:
    """``-m runtime.serve ...``: what ``planner launch`` hands torchrun for an inference plan."""
    a = ["-m", "runtime.serve", "--plan", str(Path(plan_path).resolve()), "--json-out", json_out,
         "--device", device, "--quiet"]
    for flag, v in (("--prompt-len", prompt_len), ("--output-len", output_len), ("--batch", batch)):
        if v:
            a += [flag, str(v)]
    return a


def compare_rows(summary: dict[str, Any]) -> list[tuple[str, Any, Any, str]]:
    """(label, predicted, measured, kind) rows of measured beside predicted; kind ``s`` (seconds)
    or ``n`` (a rate). The static batch's first token is the prefill of all its prompts."""
    p = summary.get("predicted") or {}
    return [("time to first token (batch prefill)", p.get("prefill_batch_s"), summary.get("ttft_s"), "s"),
            ("time per output token", p.get("tpot_s"), summary.get("tpot_s"), "s"),
            ("output tokens/s", p.get("output_tokens_per_s"), summary.get("output_tokens_per_s"), "n")]


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runtime.serve",
                                description="Serve an inference plan: greedy generation with a KV cache, tensor "
                                            "and pipeline parallel (run under torchrun, or alone for one process).")
    p.add_argument("--plan", required=True, help="inference plan file (YAML) from `planner plan --mode infer`")
    p.add_argument("--prompt-len", type=int, default=0, help="prompt tokens (default: the plan's)")
    p.add_argument("--output-len", type=int, default=0, help="tokens to generate (default: the plan's)")
    p.add_argument("--batch", type=int, default=0, help="sequences per replica (default: the plan's)")
    p.add_argument("--json-out", default="", help="write the run summary as JSON (rank 0)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--warmup", type=int, default=1, help="untimed short generations first (default 1)")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    opts = ServeOptions(prompt_len=args.prompt_len, output_len=args.output_len, batch=args.batch,
                        json_out=args.json_out, device=args.device, warmup=args.warmup, quiet=args.quiet)
    from costmodel.specs import SpecError
    from planner.plan.planfile import PlanError, read_plan

    def body() -> None:
        plan = read_plan(args.plan)
        summary = serve(plan, opts)
        if int(os.environ.get("RANK", "0")) == 0 and not args.quiet:
            brief = {k: v for k, v in summary.items() if k not in ("tokens", "token_logits", "decode_step_s")}
            print(json.dumps(brief))

    return worker.run("serve", body, (RuntimeUsageError, PlanNotRunnable, RuntimeModelError, PlanError, SpecError))


if __name__ == "__main__":
    worker.exit_now(main())
