"""The decoder-only transformer the runtime trains, built from a plan's ``ModelSpec``.

One class covers the three families the catalog holds:

* Llama-style: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP;
* GPT-style: LayerNorm (with bias), learned positions, GELU MLP, linear biases, tied embeddings;
* mixture of experts: a top-k softmax router over routed experts (dropless), optional shared
  experts, on the layers ``ModelSpec.is_moe_layer`` names.

The model never mentions a mesh. Parallelism is applied from outside (``runtime.parallel``);
the only hooks it offers are a token dispatcher on each MoE layer (local by default, all-to-all
under expert parallel) and an optional tensor-parallel group for the expert matrices.

Module names are the checkpoint's names and do not depend on the plan: layers live in a
``ModuleDict`` keyed by their global index, so a pipeline stage that holds layers 5..9 names
them ``layers.5`` .. ``layers.9``. A stage is the same class with the parts it does not own set
to ``None`` (``build_model(spec, layers=range(5, 10), embed=False, head=True)``).

Parameter counts match ``ModelSpec``'s methods exactly (a test holds them to it).
"""
from __future__ import annotations

import re
import zlib
from typing import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from costmodel.layers import model_flops_per_token
from costmodel.specs import ModelSpec

from .errors import RuntimeModelError

INIT_STD = 0.02
ROPE_THETA = 10000.0


def check_supported(spec: ModelSpec) -> None:
    if spec.attention != "mha":
        raise RuntimeModelError(f"model {spec.name!r}: attention {spec.attention!r} (multi-latent) is not "
                                "supported by the built-in runtime; use an MHA/GQA model")
    if spec.positions == "alibi":
        raise RuntimeModelError(f"model {spec.name!r}: alibi positions are not supported by the built-in "
                                "runtime; rotary and learned are")


# --------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------

def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden, eps=1e-5)
    return nn.LayerNorm(spec.hidden, eps=1e-5)   # weight and bias: ModelSpec counts 2 * hidden


def rope(q: torch.Tensor, k: torch.Tensor, theta: float = ROPE_THETA, start: int = 0
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary positions (Su et al. 2021) ``start .. start+seq-1`` on ``[batch, seq, heads,
    head_dim]``, pairs (2i, 2i+1). The one rotary rule of the runtime (training and serving)."""
    s, d = q.shape[1], q.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=q.device, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(start, start + s, device=q.device, dtype=torch.float32), inv)   # [s, d/2]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

    def rot(x: torch.Tensor) -> torch.Tensor:
        xf = x.float().unflatten(-1, (-1, 2))
        a, b = xf[..., 0], xf[..., 1]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)

    return rot(q), rot(k)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, hd = spec.hidden, spec.head_dim
        self.head_dim = hd
        self.rotary = spec.positions == "rotary"
        self.wq = nn.Linear(h, spec.heads * hd, bias=spec.bias)
        self.wk = nn.Linear(h, spec.kv_heads * hd, bias=spec.bias)
        self.wv = nn.Linear(h, spec.kv_heads * hd, bias=spec.bias)
        self.wo = nn.Linear(spec.heads * hd, h, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        # -1 heads: under tensor parallel each rank holds heads/tp query and kv_heads/tp kv heads
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.rotary:
            q, k = rope(q, k)
        rep = q.shape[2] // k.shape[2]
        if rep > 1:
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU ``w2(silu(w1 x) * w3 x)`` or GELU ``w2(gelu(w1 x))``."""

    def __init__(self, hidden: int, ffn: int, kind: str, bias: bool):
        super().__init__()
        self.kind = kind
        self.w1 = nn.Linear(hidden, ffn, bias=bias)
        self.w2 = nn.Linear(ffn, hidden, bias=bias)
        self.w3 = nn.Linear(hidden, ffn, bias=bias) if kind == "swiglu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


# --------------------------------------------------------------------------------------
# Mixture of experts
# --------------------------------------------------------------------------------------

class _ScaleGrad(torch.autograd.Function):
    """Identity forward; gradient times ``scale`` backward."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


class _CopyToGroup(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        torch.distributed.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromGroup(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        torch.distributed.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class GroupedExperts(nn.Module):
    """``num_experts`` MLPs stored as 3-D weights ``[experts, in, out]``.

    Under expert parallel the weights are DTensors sharded on dim 0 over the ``ep`` mesh
    dimension (and on the FFN dimension over ``tp`` when ``tp_group`` is set); ``forward`` works
    on the local experts only and receives their tokens already grouped.
    """

    def __init__(self, num_experts: int, hidden: int, ffn: int, kind: str, bias: bool):
        super().__init__()
        self.kind = kind
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.w2 = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, ffn)) if kind == "swiglu" else None
        if bias:
            self.b1 = nn.Parameter(torch.empty(num_experts, ffn))
            self.b2 = nn.Parameter(torch.empty(num_experts, hidden))
            self.b3 = nn.Parameter(torch.empty(num_experts, ffn)) if kind == "swiglu" else None
        else:
            self.b1 = self.b2 = self.b3 = None
        self.grad_scale = 1.0        # 1/ep under expert parallel (see runtime.parallel.apply_ep)
        self.tp_group = None         # expert tensor parallel: FFN dim sharded over this group

    def forward(self, xs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        w = {n: _local(getattr(self, n)) for n in ("w1", "w2", "w3", "b1", "b2", "b3")
             if getattr(self, n) is not None}
        if self.grad_scale != 1.0:
            w = {n: _ScaleGrad.apply(t, self.grad_scale) for n, t in w.items()}
        if self.tp_group is not None:
            xs = _CopyToGroup.apply(xs, self.tp_group)
        outs, start = [], 0
        for e, c in enumerate(counts):
            seg = xs[start:start + c]
            start += c
            a = seg @ w["w1"][e] + (w["b1"][e] if "b1" in w else 0)
            if self.kind == "swiglu":
                a = F.silu(a) * (seg @ w["w3"][e] + (w["b3"][e] if "b3" in w else 0))
            else:
                a = F.gelu(a, approximate="tanh")
            outs.append(a @ w["w2"][e])
        y = torch.cat(outs) if outs else xs.new_zeros(0, w["w2"].shape[-1])
        if self.tp_group is not None:
            y = _ReduceFromGroup.apply(y, self.tp_group)
        if "b2" in w:   # after the TP reduction: the output bias is replicated
            y = y + torch.repeat_interleave(w["b2"], torch.tensor(counts, device=y.device), dim=0)
        return y


class LocalDispatch:
    """All experts on this rank: tokens are grouped by expert and sent nowhere."""

    def __call__(self, experts: GroupedExperts, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return experts(xs, counts.tolist())


class MoE(nn.Module):
    """Top-k softmax router (Mixtral: softmax over the k selected logits), dropless routed experts
    and optional shared experts (one MLP ``shared_experts`` times as wide)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.top_k = spec.top_k
        self.num_experts = spec.num_experts
        self.router = nn.Linear(spec.hidden, spec.num_experts, bias=False)
        self.experts = GroupedExperts(spec.num_experts, spec.hidden, spec.expert_ffn_hidden, spec.mlp, spec.bias)
        self.shared = (MLP(spec.hidden, spec.shared_experts * spec.shared_expert_ffn_hidden, spec.mlp, spec.bias)
                       if spec.shared_experts else None)
        self.dispatch = LocalDispatch()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        logits = self.router(x2)
        top_val, top_idx = logits.topk(self.top_k, dim=-1)
        gates = F.softmax(top_val, dim=-1, dtype=torch.float32).type_as(x2)
        flat = top_idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=self.num_experts)
        ys = self.dispatch(self.experts, x2[token], counts)
        out = torch.zeros_like(x2).index_add(0, token, ys * gates.reshape(-1)[order, None])
        if self.shared is not None:
            out = out + self.shared(x2)
        return out.view(shape)


# --------------------------------------------------------------------------------------
# Transformer
# --------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, spec: ModelSpec, index: int):
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = _norm(spec)
        if spec.is_moe_layer(index):
            self.moe = MoE(spec)
            self.feed_forward = None
        else:
            self.moe = None
            self.feed_forward = MLP(spec.hidden, spec.ffn_hidden, spec.mlp, spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        ff = self.moe if self.moe is not None else self.feed_forward
        return h + ff(self.ffn_norm(h))


class Embeddings(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.max_seq_len, spec.hidden) if spec.positions == "learned" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)
        if self.pos is not None:
            h = h + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return h


class Transformer(nn.Module):
    """Tokens ``[batch, seq]`` in, logits ``[batch, seq, vocab]`` out; a pipeline stage without the
    embedding takes hidden states, one without the head returns them."""

    def __init__(self, spec: ModelSpec, layers: Iterable[int] | None = None, embed: bool = True,
                 head: bool = True):
        super().__init__()
        check_supported(spec)
        self.spec = spec
        ids = list(range(spec.layers) if layers is None else layers)
        self.embed = Embeddings(spec) if embed else None
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in ids})
        self.norm = _norm(spec) if head else None
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False) if head else None
        # Tied embeddings: one parameter when this part holds both ends. A last pipeline stage
        # without the embedding keeps its own copy, initialised identically and kept equal by
        # summing the two gradients (runtime.parallel.sync_tied_grads), as Megatron-LM does.
        self.tied = spec.tied_embeddings and embed and head
        if self.tied:
            self.output.weight = self.embed.tok.weight

    def retie(self) -> None:
        """Re-share the tied weight after a pass that replaced parameters (tensor parallel)."""
        if self.tied:
            self.output.weight = self.embed.tok.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.output(self.norm(h))
        return h


def build_model(spec: ModelSpec, layers: Iterable[int] | None = None, embed: bool = True,
                head: bool = True) -> Transformer:
    return Transformer(spec, layers=layers, embed=embed, head=head)


# --------------------------------------------------------------------------------------
# Deterministic initialisation, independent of how the model is split
# --------------------------------------------------------------------------------------

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


def canonical_name(name: str) -> str:
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


def init_source_name(name: str, spec: ModelSpec) -> str:
    """The name whose values a parameter takes: a last stage's copy of a tied embedding starts
    equal to the embedding."""
    if spec.tied_embeddings and name == "output.weight":
        return "embed.tok.weight"
    return name


def full_init_value(name: str, shape: torch.Size, seed: int, spec: ModelSpec) -> torch.Tensor:
    """The full (unsharded) initial value of parameter ``name``: a function of the name, the
    shape and the workload seed only, so every plan of one workload starts from the same model.
    Norm weights 1, biases 0, matrices and embeddings N(0, 0.02) (GPT-2's scheme)."""
    parts = name.split(".")
    leaf, owner = parts[-1], (parts[-2] if len(parts) > 1 else "")
    if owner.endswith("norm"):
        return torch.ones(shape) if leaf == "weight" else torch.zeros(shape)
    if leaf == "bias" or re.fullmatch(r"b\d", leaf):
        return torch.zeros(shape)
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{init_source_name(name, spec)}".encode()))
    return torch.randn(shape, generator=g) * INIT_STD


@torch.no_grad()
def init_weights(modules: Iterable[nn.Module], seed: int, spec: ModelSpec) -> None:
    """Fill every parameter (already materialised, possibly sharded) with its slice of the full
    deterministic value. Sharded DTensors get exactly their local block (``distribute_tensor``
    with ``src_data_rank=None`` slices locally, no communication); one full parameter at a time
    is built on the CPU."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    seen: set[int] = set()
    for mod in modules:
        for name, p in mod.named_parameters(remove_duplicate=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            full = full_init_value(canonical_name(name), p.shape, seed, spec)
            if isinstance(p, DTensor):
                local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                p.to_local().copy_(local)
            else:
                p.copy_(full)


def count_params(modules: Iterable[nn.Module]) -> int:
    """Global (unsharded) element count of the given modules' parameters, shared ones once."""
    seen, n = set(), 0
    for mod in modules:
        for p in mod.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
    return n


def flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Training model FLOPs per token: the cost model's one definition
    (``costmodel.layers.model_flops_per_token``; full s x s attention, PaLM App. B), so the
    measured MFU and the predicted one divide the same number."""
    return model_flops_per_token(spec, seq_len)


__all__ = ["Transformer", "rope", "Block", "Attention", "MLP", "MoE", "GroupedExperts", "LocalDispatch", "Embeddings",
           "build_model", "init_weights", "full_init_value", "canonical_name", "count_params",
           "flops_per_token", "RuntimeModelError", "check_supported"]
