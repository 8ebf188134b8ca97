"""Serving cost model: memory per GPU, time to first token, time per output token, throughput.

Inputs, kept apart as in training: the model (``ModelSpec``), the hardware (``ClusterSpec``),
the workload (``Workload`` with ``mode="infer"``: ``prompt_len`` P, ``output_len`` O,
``global_batch`` B = concurrent sequences per replica, ``dtype`` of the weights, ``kv_dtype``)
and the split (``ParallelConfig``: ``tp`` and ``pp`` shard one replica, ``dp`` is the number of
replicas, ``ep`` spreads the routed experts). Pure: no I/O, no solver.

Memory per GPU (the pipeline stage with the fullest GPU):

* weights: the stage's layer matrices in the weight dtype, split over TP (routed experts over
  EP instead when ``ep > 1``); embedding and output head in 16 bits even for quantized weights
  (AWQ/GPTQ and vLLM's fp8 leave ``lm_head`` unquantized); int8/int4 carry one fp16 scale per
  group of ``QUANT_GROUP`` weights (GPTQ/AWQ's default group size 128);
* KV cache: per token ``2 x layers x kv_heads x head_dim x bytes`` (K and V; Pope et al.,
  "Efficiently Scaling Transformer Inference", 2022, Sec. 2.1), the KV heads split over TP
  (one head per GPU, replicated, when ``tp > kv_heads``: vLLM/TensorRT-LLM do this) and the
  layers over PP; MLA keeps one compressed latent of ``kv_lora_rank + qk_rope_head_dim`` per
  layer, shared by all heads and therefore replicated on every TP rank (DeepSeek-V2 report,
  Sec. 2.1.2, Table 1; vLLM/SGLang MLA backends). Times ``B x (P + O)`` tokens;
* activations: the working set of one layer for the largest batch of tokens in flight (a
  prefill chunk of whole prompts, at most ``PREFILL_CHUNK_TOKENS`` unless one prompt is
  longer), never more than one layer's because nothing is kept for a backward pass; plus the
  fp32 logits of the sampled rows on the last stage;
* other: the GPU's ``reserved_bytes`` (CUDA context, cuBLAS/NCCL workspaces) plus
  ``RUNTIME_EXTRA_BYTES`` (CUDA graphs of the decode batch sizes, sampler buffers) plus the
  paged KV cache's partly filled last block per sequence (half of ``KV_BLOCK_TOKENS`` on
  average; vLLM's PagedAttention, Kwon et al., SOSP'23, Sec. 4.2).

``max_batch`` is the largest B whose peak fits the GPU at this context length.

Time. Every kernel is a roofline (Williams et al., CACM 2009): its compute time at the GEMM
efficiency ``costmodel.compute`` gives for its shape, and its HBM time at ``HBM_EFFICIENCY`` of
the datasheet bandwidth, combined by the smooth maximum ``(c^p + m^p)^(1/p)`` with
``p = ROOFLINE_SHARPNESS``: near the ridge point a kernel is neither purely compute- nor purely
memory-bound and takes longer than ``max(c, m)`` (the "soft roofline" shape of measured GEMM
curves; ``p -> infinity`` is the ideal roofline, ``p = 1`` no overlap at all).

* decode, one step per output token: each layer's GEMMs at ``m = B`` tokens (memory-bound for
  small B: the weights are read once per step), the attention core reading the KV cache of
  every sequence (memory-bound at any batch; a separate kernel, so its time adds to the
  GEMMs'), elementwise traffic, and ``KERNELS_PER_LAYER x KERNEL_OVERHEAD_S`` of fixed cost per
  layer (launch, ramp and tail of each kernel: the gaps an Nsight timeline of a batch-1 decode
  step shows; CUDA graphs remove the CPU launch but not these);
* prefill: the same GEMMs at ``m = prompt tokens`` (compute-bound), causal attention quadratic
  in the prompt (``4 P^2 x heads x head_dim / 2`` FLOPs per layer) on the forward curve of the
  FlashAttention build the engine runs on the GPU (``costmodel.attention``: vLLM's
  ``get_flash_attn_version`` takes FA3 on SM90 and FA2 below; FA4 on SM100 -- the same mapping as
  torchtitan's varlen attention; a chunk after a cached prefix adds a non-causal block priced at
  its shorter side), only the last position's logits;
* TP: two all-reduces of ``tokens x hidden`` activations per layer (Megatron's f/g operators,
  Shoeybi et al., 2019, Fig. 3), each ``costmodel.comm`` alpha-beta time plus
  ``COLLECTIVE_LAUNCH_S``: at batch 1 a 10 KB all-reduce is pure latency;
* PP: the micro-batches of a step circle the pipeline; a step takes the longer of one trip
  round the ring (``sum of stage times + pp hand-offs``) and ``m x`` the slowest stage, with
  ``m = min(pp, B)`` micro-batches (vLLM's and TensorRT-LLM's pipelined decode);
* MoE: only the experts some token routes to are read. With ``T`` tokens each choosing ``k`` of
  ``E`` experts uniformly, ``E x (1 - (1 - k/E)^T)`` distinct experts are touched (at T = 1
  exactly k; for T >> E/k all E). The routed experts run as one grouped GEMM
  (``grouped_expert_gemm``): each touched expert's weights read once, the compute at the grouped
  kernel's compute-bound efficiency (``costmodel.moe``, shared with training); the busiest
  expert-parallel rank handles ``costmodel.moe.load_factor`` times the mean routed copies. Expert
  parallel exchanges the tokens as the engines' default files do: vLLM's
  ``allgather_reducescatter`` backend, SGLang's default (``costmodel.moe.gather_dispatch_s``): the
  replicas' tokens all-gathered before the experts and reduce-scattered after. ``ep > 1`` means
  vLLM's expert parallel: whole experts spread over ``ep`` GPUs drawn from ``ep / tp`` replicas
  that step together (``ep`` a multiple of ``tp`` dividing ``tp x replicas``); ``ep = 1`` splits
  every expert over TP.

Reported by ``estimate_inference``, per replica, for static batches of B sequences (``--batching
static``; the figures of continuous batching, where prefill chunks share steps with running
decodes, are ``costmodel.batching``'s, built on ``_Serving.mixed_layer`` here):

* ``ttft_s``: a request joining B - 1 running sequences: its prompt's prefill, plus one decode
  step of the others that shares its scheduler step (0 when B = 1);
* ``tpot_s``: one decode step at batch B with the mean context ``P + O/2``;
* ``output_tokens_per_s``: ``replicas x B x O / (prefill of B prompts + (O - 1) x tpot)``: the
  first token comes from the prefill, the other O - 1 from decode steps (the TensorRT-LLM
  throughput benchmark's definition).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from .comm import COLLECTIVE_LAUNCH_S, GroupLayout, Network, crosses_nodes, launched, layout_for
from .attention import block_s, kernel_for
from .compute import FLASH_ATTENTION_EFFICIENCY, gemm_time_s
from .layers import ends_params, kv_heads_per_rank, layer_matrices, layer_params
from .moe import gather_dispatch_s, grouped_gemm_compute_factor, load_factor
from .specs import (ClusterSpec, GpuSpec, ModelSpec, ParallelConfig, SpecError, StageSpec, Workload, default_stages,
                    ep_problems, tp_problems)
from .units import GIB, US, dtype_bytes

# ---- constants: physical quantities, one value for every GPU and model. HBM_EFFICIENCY,
# ROOFLINE_SHARPNESS, KERNEL_OVERHEAD_S and COLLECTIVE_LAUNCH_S were chosen on a grid inside the
# ranges quoted next to them, against calibration/published_inference.yaml as a whole (largest
# error 15.6%, see VALIDATION_INFERENCE.md); nothing is set per case.
# Achievable fraction of the datasheet HBM bandwidth for streaming kernels (GEMV, paged
# attention). NVIDIA's GEMV/decode kernels reach 80-90% of peak; STREAM-like copies on A100 and
# H100 reach about 90%.
HBM_EFFICIENCY = 0.80
# Smooth-roofline exponent (module docstring). 2 puts a kernel at the ridge point at 1.41x the
# ideal roofline, as measured cuBLAS curves at m = 64..256 on A100/H100 are.
ROOFLINE_SHARPNESS = 2.0
# Fixed cost per kernel (launch + ramp + tail) and kernels per transformer layer in a fused
# serving engine: norm, QKV GEMM, rotary/KV write, attention, output GEMM, residual+norm,
# gate/up GEMM, activation, down GEMM, residual (FasterTransformer/TensorRT-LLM layer graph).
KERNEL_OVERHEAD_S = 4.0 * US
KERNELS_PER_LAYER = 10
MOE_EXTRA_KERNELS = 6           # router, top-k, permute, grouped GEMMs x2, un-permute
# COLLECTIVE_LAUNCH_S: costmodel.comm, one value for serving and training (``comm.launched``).
# Prefill is scheduled in chunks of whole prompts up to this many tokens (vLLM's
# max_num_batched_tokens for chunked prefill; TensorRT-LLM's max_num_tokens default is 8192).
PREFILL_CHUNK_TOKENS = 8192
# Quantized weights: one fp16 scale per group of this many weights (GPTQ/AWQ group size).
QUANT_GROUP = 128
RUNTIME_EXTRA_BYTES = 0.5 * GIB  # CUDA graphs, sampler and scheduler buffers (vLLM logs 0.3-1 GiB)
KV_BLOCK_TOKENS = 16             # paged KV block (vLLM default)
LOGITS_BYTES = 4                 # sampling upcasts logits to fp32

# serving's mesh, outermost first: replicas of tp x pp, TP ranks consecutive
SERVING_MESH = ("pp", "dp", "tp")

WEIGHT_DTYPES = ("bf16", "fp16", "fp32", "fp8", "int8", "int4")
KV_DTYPES = ("bf16", "fp16", "fp32", "fp8", "int8")


# --------------------------------------------------------------------------------------
# Dtypes
# --------------------------------------------------------------------------------------

def _canon(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype.lower(), dtype.lower())


def weight_bytes_per_param(dtype: str) -> float:
    """Bytes per quantized layer weight, group scales included (int8/int4: +2/QUANT_GROUP)."""
    d = _canon(dtype)
    b = dtype_bytes(d)
    if d in ("int8", "int4"):
        b += 2.0 / QUANT_GROUP
    return b


def ends_bytes_per_param(dtype: str) -> float:
    """Embedding and output head: 16-bit unless the whole model is fp32."""
    return 4.0 if _canon(dtype) == "fp32" else 2.0


def activation_bytes(dtype: str) -> float:
    return 4.0 if _canon(dtype) == "fp32" else 2.0


def kv_dtype_of(workload: Workload) -> str:
    """The KV cache's dtype: ``kv_dtype``, else the weights' (16-bit for int8/int4 weights:
    weight-only quantization keeps 16-bit activations and cache)."""
    if workload.kv_dtype:
        return _canon(workload.kv_dtype)
    d = _canon(workload.dtype)
    return "fp16" if d in ("int8", "int4") else d


def compute_dtype(dtype: str, cluster: ClusterSpec) -> str:
    """The dtype the tensor cores run: fp8 where the GPU has fp8 peak (W8A8), else 16-bit
    (weight-only quantization dequantizes to fp16/bf16 before the multiply)."""
    d = _canon(dtype)
    if d == "fp8" and "fp8" in cluster.gpu.peak_flops_per_s:
        return "fp8"
    if d == "fp32":
        return "fp32"
    return "bf16" if d in ("bf16", "fp8", "int8", "int4") else "fp16"


# --------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------

def kv_bytes_per_token_layer(model: ModelSpec, tp: int, kv_dtype: str) -> float:
    """KV-cache bytes one token adds to one layer on one GPU (module docstring)."""
    b = dtype_bytes(kv_dtype)
    if model.attention == "mla":
        return (model.kv_lora_rank + model.qk_rope_head_dim) * b     # replicated over TP
    return 2 * kv_heads_per_rank(model, tp) * model.head_dim * b


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str, tp: int = 1, pp: int = 1) -> float:
    """KV-cache bytes per token per GPU for the whole model split ``tp`` x ``pp`` (layers split
    evenly; ``estimate_inference`` uses the real stage split). Llama-3-70B in bf16 at tp = pp =
    1: 2 x 80 x 8 x 128 x 2 = 327,680 bytes."""
    return kv_bytes_per_token_layer(model, tp, kv_dtype) * model.layers / pp


def expected_experts_touched(num_experts: int, top_k: int, tokens: float) -> float:
    """Distinct experts ``tokens`` routed tokens touch, each choosing ``top_k`` of ``num_experts``
    uniformly: ``E (1 - (1 - k/E)^T)`` (the occupancy expectation)."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def expert_tp(par: ParallelConfig) -> int:
    """Ways each routed expert's FFN is split: over TP without expert parallel, whole with it."""
    return par.tp if par.ep == 1 else 1


# --------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------

def lengths(workload: Workload) -> tuple[int, int]:
    """(prompt_len, output_len) of an inference workload."""
    p, o = workload.prompt_len, workload.output_len
    if p <= 0 or o <= 0:
        raise SpecError(f"inference workload needs prompt_len and output_len > 0, got {p} and {o}")
    return p, o


def validate_serving(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig) -> None:
    """What a serving split must satisfy; every message has the numbers."""
    p, o = lengths(workload)
    problems = []
    if par.world_size != cluster.total_gpus:
        problems.append(f"tp*pp*replicas = {par.tp}*{par.pp}*{par.dp} = {par.world_size}, but the cluster "
                        f"has {cluster.total_gpus} GPUs")
    if par.cp != 1:
        problems.append(f"cp {par.cp}: context parallel is not modelled for serving (plan cp=1)")
    if par.vpp != 1:
        problems.append(f"vpp {par.vpp}: virtual pipeline stages are a training schedule")
    problems += tp_problems(model, par.tp) + ep_problems(model, par.ep)
    if par.pp > model.layers:
        problems.append(f"pp {par.pp} exceeds layers {model.layers}")
    if par.ep > 1 and (par.ep % par.tp or (par.tp * par.dp) % par.ep):
        problems.append(f"ep {par.ep} must be a multiple of tp {par.tp} dividing tp*replicas = "
                        f"{par.tp * par.dp} (whole experts over the GPUs of ep/tp replicas)")
    if p + o > model.max_seq_len:
        problems.append(f"context prompt {p} + output {o} = {p + o} exceeds {model.name}'s max_seq_len "
                        f"{model.max_seq_len}")
    if _canon(workload.dtype) not in WEIGHT_DTYPES:
        problems.append(f"weights dtype {workload.dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}")
    if kv_dtype_of(workload) not in KV_DTYPES:
        problems.append(f"KV-cache dtype {kv_dtype_of(workload)!r} is not one of {', '.join(KV_DTYPES)}")
    if len(cluster.groups) > 1:
        problems.append(f"cluster {cluster.name!r} has {len(cluster.groups)} node groups; serving plans use one "
                        "kind of GPU")
    if problems:
        raise SpecError("impossible serving configuration: " + "; ".join(problems))


# --------------------------------------------------------------------------------------
# The estimate
# --------------------------------------------------------------------------------------

@dataclass
class InferenceEstimate:
    ttft_s: float
    tpot_s: float
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    max_batch: int
    kv_cache_bytes_per_gpu: float
    kv_cache_bytes_per_token: float      # per GPU (the stage with the most layers)
    kv_cache_capacity_tokens: int        # tokens of KV cache that fit next to the weights at batch B
    request_latency_s: float             # ttft + (O - 1) * tpot
    prefill_s: float                     # all B prompts of a replica
    memory: dict[str, float]
    time: dict[str, float]
    capacity_bytes: float
    batch: int
    gpus: int
    stages: list[dict[str, Any]] = field(default_factory=list)
    batching: str = "static"             # static | inflight | disaggregated (costmodel.batching)
    schedule: dict[str, Any] = field(default_factory=dict)   # the steady state the figures come from

    @property
    def peak_bytes(self) -> float:
        return self.memory["peak_bytes"]

    @property
    def fits(self) -> bool:
        return all(s["memory"]["peak_bytes"] <= self.capacity_bytes for s in self.stages)

    def to_dict(self, stages: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "mode": "infer", "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "output_tokens_per_s_per_gpu": self.output_tokens_per_s_per_gpu,
            "max_batch": self.max_batch, "kv_cache_bytes_per_gpu": self.kv_cache_bytes_per_gpu,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "kv_cache_capacity_tokens": self.kv_cache_capacity_tokens,
            "request_latency_s": self.request_latency_s, "prefill_s": self.prefill_s, "batch": self.batch,
            "memory": dict(self.memory), "time": dict(self.time), "fits": self.fits,
            "memory_capacity_bytes": self.capacity_bytes,
        }
        if self.batching != "static":
            d["batching"] = self.batching
            d["schedule"] = dict(self.schedule)
        if stages:
            d["stages"] = [dict(s) for s in self.stages]
        return d


def soft_roofline(compute_s: float, memory_s: float, p: float = ROOFLINE_SHARPNESS) -> float:
    """Smooth maximum of a kernel's compute and memory times (module docstring)."""
    if compute_s <= 0 or memory_s <= 0:
        return max(compute_s, memory_s)
    hi = max(compute_s, memory_s)
    return hi * ((compute_s / hi) ** p + (memory_s / hi) ** p) ** (1.0 / p)


class _Pass:
    """Time of one pass of ``tokens`` through one stage, by term."""

    __slots__ = ("gemm_compute", "weights", "gemm", "attn_compute", "kv", "attn", "elementwise", "overhead",
                 "tp", "ep")

    def __init__(self) -> None:
        self.gemm_compute = 0.0    # GEMM time at the compute roof
        self.weights = 0.0         # weight reads at the memory roof
        self.gemm = 0.0            # GEMMs, combined roofline
        self.attn_compute = 0.0
        self.kv = 0.0              # KV-cache reads (decode) / writes (prefill)
        self.attn = 0.0            # attention core, combined roofline
        self.elementwise = 0.0
        self.overhead = 0.0
        self.tp = 0.0
        self.ep = 0.0

    @property
    def total(self) -> float:
        return self.gemm + self.attn + self.elementwise + self.overhead + self.tp + self.ep

    def add(self, o: "_Pass", k: float = 1.0) -> None:
        self.gemm_compute += k * o.gemm_compute
        self.weights += k * o.weights
        self.gemm += k * o.gemm
        self.attn_compute += k * o.attn_compute
        self.kv += k * o.kv
        self.attn += k * o.attn
        self.elementwise += k * o.elementwise
        self.overhead += k * o.overhead
        self.tp += k * o.tp
        self.ep += k * o.ep


def grouped_expert_gemm(gpu: GpuSpec, cluster: ClusterSpec, dtype: str, hbm_bytes_per_s: float, a_bytes: float,
                        tokens_per_expert: float, experts: float, n: float, k: float,
                        weight_bytes: float) -> tuple[float, float]:
    """(compute, memory) seconds of one grouped expert GEMM over ``experts`` experts of ``n x k``,
    ``tokens_per_expert`` tokens each, for ``soft_roofline``. Compute: the whole grouped problem's
    FLOPs at the dense efficiency of its total size, slowed by the grouped kernel's compute-bound
    factor (``costmodel.moe.grouped_gemm_compute_factor``, the rule training uses). Memory: each
    expert's weights read once (``weight_bytes``) and the tokens in and out. DeepGEMM's small-M
    fall is not applied to the compute: at decode sizes it is the weight reads, which the memory
    term counts already (tests/test_moe_serving.py holds this against DeepGEMM's masked points)."""
    m = tokens_per_expert * experts
    comp = gemm_time_s(gpu, cluster, dtype, m, n, k, waves=False) / grouped_gemm_compute_factor(k)
    mem = (weight_bytes + m * (k + n) * a_bytes) / hbm_bytes_per_s
    return comp, mem


def serving_gpu(gpu: GpuSpec) -> GpuSpec:
    """The GPU as serving prices it: its own GEMM efficiency where the catalog keeps one
    (``GpuSpec.serving_matmul_efficiency``), else training's."""
    if gpu.serving_matmul_efficiency and gpu.serving_matmul_efficiency != gpu.matmul_efficiency:
        return dataclasses.replace(gpu, matmul_efficiency=gpu.serving_matmul_efficiency)
    return gpu


class _Serving:
    """Per-GPU costs of one serving configuration; built once per estimate."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig):
        self.m, self.c, self.w, self.par = model, cluster, workload, par
        self.gpu = gpu = serving_gpu(cluster.gpu)
        self.cdt = compute_dtype(workload.dtype, cluster)
        self.wb = weight_bytes_per_param(workload.dtype)
        self.eb = ends_bytes_per_param(workload.dtype)
        self.ab = activation_bytes(workload.dtype)
        self.kvdt = kv_dtype_of(workload)
        self.hbm = gpu.hbm_bandwidth_bytes_per_s * HBM_EFFICIENCY
        self.net = Network(cluster)
        gpn = cluster.nvlink_gpus
        # default serving mesh (pp, dp, tp) outer -> inner: TP ranks consecutive, an EP group the
        # tp x ep/tp consecutive ranks of ep/tp neighbouring replicas
        self.tp_lay = layout_for(par.tp, 1, gpn)
        # the ranks of an EP group that hold different tokens: one per replica, stride tp
        self.gather_lay = layout_for(par.ep // par.tp, par.tp, gpn) if par.ep > par.tp else GroupLayout(1, 1)
        self.load = (load_factor(model.router_balance, model.router_aux_coeff, 0.0, par.ep)
                     if model.is_moe else 1.0)
        self.pp_cross = crosses_nodes({"pp": par.pp, "dp": par.dp, "tp": par.tp}, SERVING_MESH, "pp", gpn)
        self.etp = expert_tp(par)
        self.kv_layer = kv_bytes_per_token_layer(model, par.tp, self.kvdt)
        self.kvh = kv_heads_per_rank(model, par.tp) if model.attention == "mha" else 0
        self._weights: dict = {}

    # ---- pieces -----------------------------------------------------------------------
    def _gemm(self, m: float, n: float, k: float, count: float, weight_bytes: float, out: _Pass) -> None:
        if m <= 0 or count <= 0:
            return
        comp = gemm_time_s(self.gpu, self.c, self.cdt, m, n, k, count, waves=False)
        act = (m * k + m * n) * count * self.ab          # activations in and out
        mem = (weight_bytes + act) / self.hbm
        out.gemm_compute += comp
        out.weights += weight_bytes / self.hbm
        out.gemm += soft_roofline(comp, mem)

    def _expert_gemm(self, per: float, n: float, k: float, experts: float, weight_bytes: float, out: _Pass) -> None:
        """The routed experts' grouped GEMM (``grouped_expert_gemm``), added to ``out``."""
        if per <= 0 or experts <= 0:
            return
        comp, mem = grouped_expert_gemm(self.gpu, self.c, self.cdt, self.hbm, self.ab, per, experts, n, k,
                                        weight_bytes)
        out.gemm_compute += comp
        out.weights += weight_bytes / self.hbm
        out.gemm += soft_roofline(comp, mem)

    def _allreduce(self, nbytes: float) -> float:
        if self.par.tp <= 1:
            return 0.0
        return launched(self.net.all_reduce(nbytes, self.tp_lay))

    def _elementwise_elems(self) -> float:
        """HBM traffic per token per layer of the memory-bound ops, in activation elements: two
        norms (read + write h each), two residual adds (read 2h, write h each), rotary on q and k
        (read + write), the MLP activation (SwiGLU reads 2 x ffn and writes ffn; GELU reads and
        writes ffn), the FFN split over TP."""
        m, t = self.m, self.par.tp
        h = m.hidden
        e = 2 * 2 * h + 2 * 3 * h                       # two norms, two residual adds
        e += 2 * (m.q_dim / t + self.kvh * m.head_dim)  # rotary on q and k (read + write)
        f = m.ffn_hidden / t
        e += 3 * f if m.mlp == "swiglu" else 2 * f      # activation function
        return e

    def layer(self, moe: bool, tokens: float, seqs: float, ctx: float, prefill: bool) -> _Pass:
        """One layer on one GPU for ``tokens`` tokens of ``seqs`` sequences. Decode: one token per
        sequence attending to ``ctx`` cached tokens. Prefill: ``tokens / seqs`` prompt tokens per
        sequence attending causally to each other."""
        if prefill:
            return self.mixed_layer(moe, 0.0, 0.0, tokens, seqs, 0.0)
        return self.mixed_layer(moe, seqs, ctx, 0.0, 0.0, 0.0)

    def _attention_prefill(self, seqs: float, s: float, past: float, out: _Pass) -> None:
        """Causal attention of ``seqs`` chunks of ``s`` new tokens, each after ``past`` cached
        tokens of its own prompt (chunked prefill: the chunk attends to the cached prefix and
        causally to itself; ``past = 0`` is a whole prompt)."""
        m = self.m
        heads = m.heads / self.par.tp
        if m.attention == "mla":
            per_head = (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        else:
            per_head = 2 * m.head_dim
        flops = 2 * seqs * s * (past + s * 0.5) * heads * per_head       # causal: half the s x s
        kernel = kernel_for("varlen", self.gpu)
        peak = self.gpu.attention_rate(self.cdt)
        causal = 2 * seqs * s * s * 0.5 * heads * per_head
        comp = block_s(kernel, self.gpu, peak, causal, m.head_dim, s, True)[0]
        if past > 0:
            comp += block_s(kernel, self.gpu, peak, flops - causal, m.head_dim, min(s, past), False)[0]
        mem = seqs * (s + past) * self.kv_layer / self.hbm              # chunk written, prefix read
        out.attn_compute += comp
        out.kv += mem
        out.attn += soft_roofline(comp, mem)

    def _attention_decode(self, seqs: float, ctx: float, out: _Pass) -> None:
        """One new token for each of ``seqs`` sequences attending to ``ctx`` cached tokens."""
        m = self.m
        heads = m.heads / self.par.tp
        if m.attention == "mla":    # weights absorbed: scores and values on the latent
            per_head = 2 * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        else:
            per_head = 4 * m.head_dim
        flops = seqs * ctx * heads * per_head
        eff = self.gpu.matmul_efficiency * FLASH_ATTENTION_EFFICIENCY
        comp = flops / (self.gpu.attention_rate(self.cdt) * eff)
        mem = seqs * ctx * self.kv_layer / self.hbm                      # every sequence's cache read
        out.attn_compute += comp
        out.kv += mem
        out.attn += soft_roofline(comp, mem)

    def mixed_layer(self, moe: bool, dec_seqs: float, dec_ctx: float, pre_tokens: float, pre_seqs: float,
                    pre_past: float) -> _Pass:
        """One layer on one GPU for one scheduler step of continuous batching: ``dec_seqs``
        decoding sequences (one token each, ``dec_ctx`` cached tokens) and ``pre_tokens`` prompt
        tokens in ``pre_seqs`` chunks, each after ``pre_past`` cached tokens of its prompt. The
        GEMMs run once over all ``dec_seqs + pre_tokens`` tokens (vLLM V1 and TensorRT-LLM pack a
        step's tokens into one flattened batch), so the weights are read once per step; the two
        kinds of attention are separate kernels (TensorRT-LLM's context and generation phases);
        a pure decode or pure prefill step is the special case."""
        m, par, out = self.m, self.par, _Pass()
        t, h = par.tp, self.m.hidden
        T = dec_seqs + pre_tokens
        wb = self.wb
        # the layer's matrices (``costmodel.layers.layer_matrices``, shared with training): every
        # token through the attention and dense ones; the experts further down
        matrices = layer_matrices(m, moe, t, par.ep, self.etp)
        for mx in matrices:
            if mx.role == "dense" and not mx.name.startswith("shared_expert"):
                self._gemm(T, mx.n, mx.k, mx.count, mx.k * mx.n * mx.count * wb, out)
        # attention core
        kernels = KERNELS_PER_LAYER
        if pre_tokens > 0:
            self._attention_prefill(pre_seqs, pre_tokens / pre_seqs, pre_past, out)
        if dec_seqs > 0:
            self._attention_decode(dec_seqs, dec_ctx, out)
        if pre_tokens > 0 and dec_seqs > 0:
            kernels += 1                     # the second attention kernel of a mixed step
        # MLP (MoE: router, shared experts, then the routed experts some token touches)
        if moe:
            E, k = m.num_experts, m.top_k
            local = E / par.ep
            # tokens whose experts live in this GPU's EP group: its replica's, times ep/tp replicas
            group_tokens = T * (par.ep / t if par.ep > 1 else 1)
            touched = local * expected_experts_touched(E, k, group_tokens) / E
            copies = group_tokens * k * local / E                        # routed token copies here
            for mx in matrices:
                if mx.role == "router":
                    self._gemm(T, mx.n, mx.k, 1, mx.k * mx.n * self.eb, out)      # 16-bit router
                elif mx.name.startswith("shared_expert"):
                    self._gemm(T, mx.n, mx.k, 1, mx.k * mx.n * wb, out)
            if touched > 0:
                # the busiest expert-parallel rank's routed copies (``costmodel.moe.load_factor``, the
                # rule training uses): it sets the pace of the layer; the weights it reads are its
                # touched experts' whatever their load
                per = copies * self.load / touched
                for mx in matrices:
                    if mx.role == "expert":
                        self._expert_gemm(per, mx.n, mx.k, touched, touched * mx.n * mx.k * wb, out)
            # the engines' gather dispatcher (``costmodel.moe.gather_dispatch_s``) over the ranks
            # that hold different tokens: the ep/tp replicas of the EP group (TP ranks share theirs)
            out.ep += sum(launched(c) for c in gather_dispatch_s(T * h * self.ab, self.gather_lay, self.net))
            kernels += MOE_EXTRA_KERNELS
        out.elementwise += T * self._elementwise_elems() * self.ab / self.hbm
        out.overhead += kernels * KERNEL_OVERHEAD_S
        out.tp += 2 * self._allreduce(T * h * self.ab)
        return out

    def ends(self, first: bool, last: bool, tokens: float, rows: float) -> _Pass:
        """Embedding (first stage: a gather, plus the vocab-parallel all-reduce) and output head
        for ``rows`` sampled positions (last stage), on one GPU."""
        out = _Pass()
        m, t = self.m, self.par.tp
        if first:
            out.elementwise += tokens * m.hidden * self.ab / self.hbm
            out.tp += self._allreduce(tokens * m.hidden * self.ab)
            out.overhead += KERNEL_OVERHEAD_S
        if last:
            v = m.vocab / t
            self._gemm(rows, v, m.hidden, 1, v * m.hidden * self.eb, out)
            out.elementwise += rows * v * LOGITS_BYTES * 2 / self.hbm     # softmax / argmax over logits
            if t > 1:   # logits gathered to the sampler
                out.tp += launched(self.net.all_gather(rows * m.vocab * LOGITS_BYTES, self.tp_lay))
            out.overhead += 3 * KERNEL_OVERHEAD_S                        # final norm, head, sampler
        return out

    def stage_pass(self, st: StageSpec, index: int, tokens: float, seqs: float, ctx: float, prefill: bool,
                   memo: dict) -> _Pass:
        n_moe = self.m.moe_layers_in(st.first_layer, st.last_layer)
        n_dense = st.num_layers - n_moe
        out = _Pass()
        for moe, n in ((False, n_dense), (True, n_moe)):
            if n:
                key = (moe, tokens, seqs, ctx, prefill)
                if key not in memo:
                    memo[key] = self.layer(moe, tokens, seqs, ctx, prefill)
                out.add(memo[key], n)
        out.add(self.ends(index == 0, index == self.par.pp - 1, tokens, seqs))
        return out

    def mixed_stage_pass(self, st: StageSpec, index: int, dec_seqs: float, dec_ctx: float, pre_tokens: float,
                         pre_seqs: float, pre_past: float, memo: dict) -> _Pass:
        """One scheduler step of continuous batching through stage ``index`` (``mixed_layer``); the
        last stage samples one row per decoding sequence and per prompt chunk."""
        n_moe = self.m.moe_layers_in(st.first_layer, st.last_layer)
        n_dense = st.num_layers - n_moe
        out = _Pass()
        for moe, n in ((False, n_dense), (True, n_moe)):
            if n:
                key = ("mixed", moe, dec_seqs, dec_ctx, pre_tokens, pre_seqs, pre_past)
                if key not in memo:
                    memo[key] = self.mixed_layer(moe, dec_seqs, dec_ctx, pre_tokens, pre_seqs, pre_past)
                out.add(memo[key], n)
        out.add(self.ends(index == 0, index == self.par.pp - 1, dec_seqs + pre_tokens, dec_seqs + pre_seqs))
        return out

    # ---- memory -------------------------------------------------------------------------
    def stage_weights(self, st: StageSpec, index: int) -> float:
        key = (st.first_layer, st.num_layers, index)
        if key not in self._weights:
            self._weights[key] = self._stage_weights(st, index)
        return self._weights[key]

    def _stage_weights(self, st: StageSpec, index: int) -> float:
        """Weight bytes of a stage on one GPU, from the layer description training uses
        (``layers.layer_params``, ``layers.ends_params``): layer matrices and routed experts in the
        weight dtype, router, norms, embedding and head in 16 bits (module docstring)."""
        m, par = self.m, self.par
        n_moe = m.moe_layers_in(st.first_layer, st.last_layer)
        n_dense = st.num_layers - n_moe
        w = 0.0
        for moe, n in ((False, n_dense), (True, n_moe)):
            if n:
                lp = layer_params(m, moe, par.tp, par.ep, self.etp)
                w += n * ((lp.matrices + lp.experts) * self.wb + (lp.router + lp.norms) * self.eb)
        ends = ends_params(m, par.tp, par.pp, index == 0, index == par.pp - 1)
        return w + ends.total * self.eb

    def activation_bytes(self, chunk_tokens: float, rows: float, last: bool) -> float:
        """One layer's live tensors for ``chunk_tokens`` tokens, plus fp32 logits of ``rows``."""
        m, t = self.m, self.par.tp
        h = m.hidden
        attn = m.q_dim / t + 2 * max(self.kvh * m.head_dim, (m.kv_lora_rank + m.qk_rope_head_dim)) + \
            m.attn_out_dim / t
        mats = 3 if m.mlp == "swiglu" else 2
        mlp = mats * m.ffn_hidden / t
        if m.is_moe:
            moe = m.top_k * (h + mats * m.expert_ffn_hidden / self.etp) + m.num_experts * 2
            if m.shared_experts:
                moe += mats * m.shared_expert_ffn_hidden * m.shared_experts / t
            mlp = max(mlp if m.first_dense_layers else 0.0, moe)
        per_token = (2 * h + max(attn, mlp)) * self.ab
        logits = rows * m.vocab / t * (LOGITS_BYTES + self.ab) if last else 0.0
        return chunk_tokens * per_token + logits


def _chunking(prompt: int, n: float) -> tuple[float, float, float]:
    """(prompts per chunk, number of chunks, tokens per chunk) to prefill ``n`` prompts."""
    per = max(1, PREFILL_CHUNK_TOKENS // prompt)
    per = min(per, max(n, 1))
    chunks = max(1.0, n / per)
    return per, chunks, per * prompt


def _pipeline(times: list[float], hop: float, micro: float) -> float:
    """A decode step with ``micro`` micro-batches circling ``len(times)`` stages: the longer of one
    trip round the ring and ``micro`` passes of the slowest stage (module docstring)."""
    if len(times) == 1:
        return times[0]
    trip = sum(times) + len(times) * hop
    return max(trip, micro * (max(times) + hop))


def estimate_inference(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                       order: tuple[str, ...] | None = None,
                       stages: tuple[StageSpec, ...] | None = None) -> InferenceEstimate:
    """Memory per GPU, latency and throughput of one serving configuration (module docstring).
    ``order`` is accepted for symmetry with training; serving places TP innermost."""
    validate_serving(model, cluster, workload, par)
    P, O = lengths(workload)
    B = workload.global_batch
    stages = tuple(stages) if stages is not None else default_stages(model.layers, par.pp)
    if len(stages) != par.pp or sum(s.num_layers for s in stages) != model.layers or \
            any(s.num_layers < 1 for s in stages):
        raise SpecError(f"stage split {[s.num_layers for s in stages]} must have pp = {par.pp} non-empty "
                        f"stages covering all {model.layers} layers")
    sv = _Serving(model, cluster, workload, par)
    gpu = cluster.gpu
    pp = par.pp
    ctx_total = P + O
    ctx_mean = P + O / 2.0

    def hop(tokens: float) -> float:
        """One pipeline hand-off of ``tokens`` hidden states (point-to-point)."""
        if pp == 1:
            return 0.0
        return launched(sv.net.p2p(tokens * model.hidden * sv.ab, sv.pp_cross, pp))

    # ---- decode --------------------------------------------------------------------------
    micro = min(pp, B)
    b = B / micro
    memo: dict = {}
    dec = [sv.stage_pass(st, i, b, b, ctx_mean, False, memo) for i, st in enumerate(stages)]
    tpot = _pipeline([d.total for d in dec], hop(b), micro)
    dec_others = 0.0
    if B > 1:
        micro_o = min(pp, B - 1)
        bo = (B - 1) / micro_o
        others = [sv.stage_pass(st, i, bo, bo, ctx_mean, False, memo) for i, st in enumerate(stages)]
        dec_others = _pipeline([d.total for d in others], hop(bo), micro_o)

    # ---- prefill -------------------------------------------------------------------------
    def prefill(n: float) -> tuple[float, list[_Pass]]:
        per, chunks, tokens = _chunking(P, n)
        passes = [sv.stage_pass(st, i, tokens, per, 0.0, True, memo) for i, st in enumerate(stages)]
        times = [x.total for x in passes]
        # chunks pipeline through the stages: fill once, then one chunk per slowest-stage time
        total = sum(times) + (chunks - 1) * max(times) + (pp - 1) * hop(tokens)
        return total, passes

    pre1, pre1_passes = prefill(1)
    pre_b, _ = prefill(B)
    ttft = pre1 + dec_others
    round_s = pre_b + (O - 1) * tpot
    per_replica = B * O / round_s
    out_tps = per_replica * par.dp

    # ---- memory --------------------------------------------------------------------------
    stage_rows = []
    for i, st in enumerate(stages):
        kv_tok = st.num_layers * sv.kv_layer
        mem = serving_stage_memory(sv, st, i, P, ctx_total, B)
        stage_rows.append({"layers": [st.first_layer, st.last_layer], "device_group": st.group,
                           "memory": mem, "kv_cache_bytes_per_token": kv_tok,
                           "decode_s": dec[i].total, "prefill_s": pre1_passes[i].total,
                           "capacity_bytes": gpu.memory_bytes,
                           "fits": mem["peak_bytes"] <= gpu.memory_bytes})
    worst = max(range(pp), key=lambda i: stage_rows[i]["memory"]["peak_bytes"])
    mem = dict(stage_rows[worst]["memory"])
    kv_tok_max = max(r["kv_cache_bytes_per_token"] for r in stage_rows)
    max_b = _max_batch_cached(model, cluster, dataclasses.replace(workload, global_batch=1), par, stages)
    free = min(gpu.memory_bytes - (r["memory"]["peak_bytes"] - r["memory"]["kv_cache_bytes"])
               for r in stage_rows)
    cap_tokens = int(max(0.0, free) // kv_tok_max) if kv_tok_max > 0 else 0

    # ---- breakdown. Decode: per step, the slowest stage's terms times the passes it makes
    # (its micro-batches), the hand-offs, and the wait for the ring trip (pipeline); the
    # terms sum to tpot. Prefill: one prompt, summed over the stages (sum = prefill_s).
    k = max(range(pp), key=lambda i: dec[i].total)
    d = dec[k]
    hops = (max(pp, micro) * hop(b)) if pp > 1 else 0.0
    busy = micro * d.total + hops
    pf = _Pass()
    for x in pre1_passes:
        pf.add(x)
    time = {
        "prefill_s": pre1, "prefill_gemm_s": pf.gemm, "prefill_attention_s": pf.attn,
        "prefill_elementwise_s": pf.elementwise, "prefill_overhead_s": pf.overhead, "prefill_tp_comm_s": pf.tp,
        "prefill_ep_comm_s": pf.ep, "prefill_pp_comm_s": (pp - 1) * hop(P),
        "prefill_compute_s": pf.gemm_compute + pf.attn_compute, "prefill_weights_s": pf.weights,
        "decode_step_s": tpot, "decode_gemm_s": micro * d.gemm, "decode_attention_s": micro * d.attn,
        "decode_elementwise_s": micro * d.elementwise, "decode_overhead_s": micro * d.overhead,
        "decode_tp_comm_s": micro * d.tp, "decode_ep_comm_s": micro * d.ep, "decode_pp_comm_s": hops,
        "decode_pipeline_wait_s": max(0.0, tpot - busy),
        "decode_compute_s": micro * (d.gemm_compute + d.attn_compute), "decode_weights_s": micro * d.weights,
        "decode_kv_s": micro * d.kv, "decode_others_s": dec_others, "prefill_batch_s": pre_b,
    }
    world = par.world_size
    return InferenceEstimate(
        ttft_s=ttft, tpot_s=tpot, output_tokens_per_s=out_tps, output_tokens_per_s_per_gpu=out_tps / world,
        max_batch=max_b, kv_cache_bytes_per_gpu=mem["kv_cache_bytes"], kv_cache_bytes_per_token=kv_tok_max,
        kv_cache_capacity_tokens=cap_tokens, request_latency_s=ttft + (O - 1) * tpot, prefill_s=pre_b,
        memory=mem, time=time, capacity_bytes=gpu.memory_bytes, batch=B, gpus=world, stages=stage_rows)


def stage_memory_parts(sv: _Serving, st: StageSpec, index: int, kv_bytes: float, activations_bytes: float,
                       waste_bytes: float = 0.0) -> dict[str, float]:
    """Peak memory of one GPU of stage ``index`` by category, given the KV cache it holds and its
    activations: its weights (``_Serving.stage_weights``) + KV + activations + other (the GPU's
    reserved bytes, ``RUNTIME_EXTRA_BYTES``, partly filled KV blocks). The one rule every serving
    model sums (aggregated replicas, the engine's KV pool, prefill pools, the operating point)."""
    w = sv.stage_weights(st, index)
    return memory_parts(w, kv_bytes, activations_bytes, sv.gpu.reserved_bytes + RUNTIME_EXTRA_BYTES + waste_bytes)


def memory_parts(weights_bytes: float, kv_bytes: float, activations_bytes: float,
                 other_bytes: float) -> dict[str, float]:
    """The serving memory breakdown and its peak, the sum of the four."""
    return {"peak_bytes": weights_bytes + kv_bytes + activations_bytes + other_bytes, "weights_bytes": weights_bytes,
            "kv_cache_bytes": kv_bytes, "activations_bytes": activations_bytes, "other_bytes": other_bytes}


def serving_stage_memory(sv: _Serving, st: StageSpec, index: int, prompt: int, ctx: int,
                         batch: int) -> dict[str, float]:
    """Peak memory of one GPU of stage ``index`` serving ``batch`` sequences of context ``ctx``
    (module docstring), by category: the one rule for the estimate and for ``max_batch``."""
    last = index == sv.par.pp - 1
    micro = min(sv.par.pp, batch)
    per_chunk, _, chunk_tokens = _chunking(prompt, batch)
    kv_tok = st.num_layers * sv.kv_layer
    # a sliding-window layer caches at most its window (ModelSpec.kv_tokens_in; num_layers * ctx without one)
    kv = batch * sv.m.kv_tokens_in(st.first_layer, st.last_layer, ctx) * sv.kv_layer
    act = max(sv.activation_bytes(chunk_tokens, per_chunk, last),
              sv.activation_bytes(batch / micro, batch / micro, last))
    waste = batch * KV_BLOCK_TOKENS / 2 * kv_tok            # the partly filled last block per sequence
    return stage_memory_parts(sv, st, index, kv, act, waste)


def stage_peak_bytes(sv: _Serving, stages: tuple[StageSpec, ...], prompt: int, ctx: int, batch: int) -> float:
    """Largest peak over the stages at ``batch`` sequences (``serving_stage_memory``)."""
    return max(serving_stage_memory(sv, st, i, prompt, ctx, batch)["peak_bytes"] for i, st in enumerate(stages))


def max_batch(sv: _Serving, stages: tuple[StageSpec, ...], prompt: int, ctx: int, capacity: float) -> int:
    """The largest batch whose peak fits ``capacity`` (peak is nondecreasing in the batch)."""
    if stage_peak_bytes(sv, stages, prompt, ctx, 1) > capacity:
        return 0
    lo, hi = 1, 2
    while stage_peak_bytes(sv, stages, prompt, ctx, hi) <= capacity:
        lo, hi = hi, hi * 2
        if hi > 1 << 24:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if stage_peak_bytes(sv, stages, prompt, ctx, mid) <= capacity:
            lo = mid
        else:
            hi = mid
    return lo


@lru_cache(maxsize=4096)
def _max_batch_cached(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                      stages: tuple[StageSpec, ...]) -> int:
    """Memoized on the batch-free problem: the planner scores many batches of one split."""
    P, O = lengths(workload)
    return max_batch(_Serving(model, cluster, workload, par), stages, P, P + O, cluster.gpu.memory_bytes)


def serving_max_batch(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                      stages: tuple[StageSpec, ...] | None = None) -> int:
    """``max_batch`` alone (cheap: no time model), for the planner's batch enumeration."""
    validate_serving(model, cluster, workload, par)
    return _max_batch_cached(model, cluster, dataclasses.replace(workload, global_batch=1), par,
                             tuple(stages or default_stages(model.layers, par.pp)))


def check_invariants(est: InferenceEstimate) -> None:
    """Sanity after every estimate (programmer errors, not user input)."""
    assert est.ttft_s > 0 and est.tpot_s > 0 and est.output_tokens_per_s > 0, est
    m = est.memory
    parts = m["weights_bytes"] + m["kv_cache_bytes"] + m["activations_bytes"] + m["other_bytes"]
    assert abs(parts - m["peak_bytes"]) <= 1e-6 * m["peak_bytes"], m


__all__ = ["InferenceEstimate", "estimate_inference", "kv_bytes_per_token", "kv_bytes_per_token_layer",
           "kv_heads_per_rank", "expected_experts_touched", "validate_serving", "serving_max_batch",
           "soft_roofline", "kv_dtype_of", "compute_dtype", "weight_bytes_per_param", "lengths",
           "check_invariants", "HBM_EFFICIENCY", "ROOFLINE_SHARPNESS", "KERNEL_OVERHEAD_S",
           "COLLECTIVE_LAUNCH_S"]
