"""The continuous-batching model (costmodel/batching.py): the reported TTFT, TPOT and throughput
of an in-flight plan satisfy Little's law and come from the step schedule they report; the KV
pool limits concurrency as a block manager does; mixed steps cost what their parts cost; the
disaggregated estimate adds up."""
from __future__ import annotations

import math

import pytest

from costmodel.batching import (InflightReplica, Pool, SchedulerConfig, estimate_disaggregated, estimate_inflight,
                                estimate_serving, inflight_point, kv_capacity, scheduler_defaults)
from costmodel.catalog import get_model
from costmodel.inference import estimate_inference
from costmodel.specs import ParallelConfig, SpecError, Workload
from costmodel.files.clusters import load_cluster

H100 = load_cluster("dgx-h100")


def _wl(P=1000, O=200, kv="bf16", dtype="bf16"):
    return Workload(global_batch=1, seq_len=P + O, mode="infer", prompt_len=P, output_len=O, kv_dtype=kv, dtype=dtype)


def _rep(model="llama-3.1-70b", gpus=8, tp=4, pp=1, dp=2, ep=1, server="vllm", **wl):
    c = H100.with_gpus(gpus)
    return InflightReplica(get_model(model), c, _wl(**wl), ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep),
                           scheduler_defaults(server, c.gpu))


@pytest.mark.parametrize("case", [dict(), dict(tp=2, pp=2, dp=2), dict(P=200, O=2000, tp=8, dp=1),
                                  dict(model="mixtral-8x7b", tp=1, dp=8, ep=8, P=2000, O=500),
                                  dict(server="tensorrt-llm", P=5000, O=500, tp=2, dp=4)])
def test_littles_law_and_the_step_schedule(case):
    rep = _rep(**case)
    P, O = rep.sm.P, rep.sm.O
    for est in rep.curve():
        s = est.schedule
        X, tau = s["request_rate_per_s"], s["mean_step_s"]
        # the figures are the schedule's
        assert est.tpot_s == tau
        assert est.ttft_s == pytest.approx(s["residual_s"] + s["queue_s"] + s["prefill_s"], rel=1e-12)
        assert est.output_tokens_per_s == pytest.approx(X * O * rep.par.dp, rel=1e-12)
        assert est.output_tokens_per_s_per_gpu == pytest.approx(est.output_tokens_per_s / rep.par.world_size)
        # Little's law: the whole request, and the decode phase alone (O - 1 steps per request)
        assert s["concurrency"] == pytest.approx(X * (est.ttft_s + (O - 1) * est.tpot_s), rel=1e-9)
        assert s["decode_batch"] == pytest.approx(X * (O - 1) * tau, rel=1e-9)
        # prompt tokens arrive as fast as they are scheduled: X P per second = D per step
        assert s["prefill_tokens_per_step"] == pytest.approx(X * P * tau, rel=1e-9)
        assert s["prefill_tokens_per_step"] == pytest.approx(s["mixed_fraction"] * s["chunk_tokens"], rel=1e-9) \
            or rep.par.ep > rep.par.tp                      # lock-stepped EP replicas mix more often
        # TPOT is the mix of the two kinds of step
        f = s["mixed_fraction"]
        assert tau == pytest.approx(f * s["mixed_step_s"] + (1 - f) * s["decode_step_s"], rel=1e-12)
        assert s["decode_step_s"] <= s["mixed_step_s"]
        # a step never holds more tokens than the budget, nor more requests than the KV pool
        assert s["decode_batch"] + s["chunk_tokens"] <= rep.sched.token_budget + 1e-6
        assert s["running"] <= rep.kv.max_running + 1e-6
        assert est.peak_bytes <= est.capacity_bytes


def test_more_load_means_more_throughput_and_slower_tokens():
    curve = _rep().curve()
    thr = [e.output_tokens_per_s for e in curve]
    tpot = [e.tpot_s for e in curve]
    conc = [e.schedule["concurrency"] for e in curve]
    assert thr == sorted(thr) and tpot == sorted(tpot) and conc == sorted(conc)
    assert thr[-1] > 10 * thr[0]


def test_prefill_chunks_slow_the_decode_of_everyone_else():
    """The issue's case: llama-3.1-70b, tp4 x 2 replicas at 108 concurrent requests, prompts of 1000
    and outputs of 200. Static batching reports the TPOT of decode-only steps (28 ms); in flight,
    about half the steps carry a new prompt, and TPOT is about twice that."""
    m, c = get_model("llama-3.1-70b"), H100.with_gpus(8)
    par = ParallelConfig(tp=4, dp=2)
    static = estimate_inference(m, c, Workload(global_batch=108, seq_len=1200, mode="infer", prompt_len=1000,
                                               output_len=200), par)
    est = estimate_inflight(m, c, _wl(), par, scheduler_defaults("vllm", c.gpu), concurrency=108)
    s = est.schedule
    assert s["concurrency"] == pytest.approx(108, rel=1e-6)
    assert 0.3 < s["mixed_fraction"] < 0.8 and s["chunk_tokens"] == 1000
    assert est.tpot_s > 1.8 * static.tpot_s
    assert s["decode_step_s"] == pytest.approx(static.tpot_s, rel=0.05)     # the same decode-only step


def test_a_concurrency_or_a_rate_is_met_by_the_schedule():
    rep = _rep()
    est = rep.at(concurrency=40)
    assert est.schedule["concurrency"] == pytest.approx(40, rel=1e-6)
    r = est.schedule["request_rate_per_s"]
    again = rep.at(rate_per_s=r)
    assert again.schedule["decode_batch"] == pytest.approx(est.schedule["decode_batch"], rel=1e-6)
    with pytest.raises(SpecError, match="exceeds"):
        rep.at(rate_per_s=rep.top.request_rate_per_s * 1.5)
    # more users than run at once wait for a slot: throughput stays, TTFT grows by N / X
    over = rep.at(concurrency=rep.top.concurrency * 2)
    assert over.output_tokens_per_s == pytest.approx(rep.top.output_tokens_per_s * rep.par.dp)
    assert over.schedule["concurrency"] == pytest.approx(over.schedule["request_rate_per_s"]
                                                         * (over.ttft_s + (rep.sm.O - 1) * over.tpot_s))


def test_kv_pool_is_the_block_managers():
    rep = _rep(P=8000, O=2000)
    kv, sched = rep.kv, rep.sched
    m = kv.memory
    cap = H100.gpu.memory_bytes
    assert kv.pool_bytes == pytest.approx(sched.gpu_memory_utilization * cap - m["weights_bytes"]
                                          - m["activations_bytes"] - m["other_bytes"])
    assert kv.blocks == kv.capacity_tokens // 16
    per = (8000 + 1999 / 2) / 16 + 0.5                    # allocated on demand: the mean context
    assert kv.blocks_per_request == pytest.approx(per)
    assert kv.max_running == int(kv.blocks // per) and kv.kv_limited
    # a higher memory share holds more requests; TensorRT-LLM reserves the whole context
    more = kv_capacity(rep.sm, SchedulerConfig(gpu_memory_utilization=0.95))
    assert more.max_running > kv.max_running
    trt = kv_capacity(rep.sm, scheduler_defaults("tensorrt-llm", H100.gpu))
    assert trt.blocks_per_request == math.ceil(10000 / 32)
    # the KV pool caps what runs at once, and with it the throughput
    assert rep.top.running <= kv.max_running + 1e-6


def test_no_room_for_one_request_is_an_error():
    c = H100.with_gpus(2)
    with pytest.raises(SpecError, match="fits the KV pool"):
        estimate_inflight(get_model("llama-3.1-70b"), c, _wl(), ParallelConfig(tp=2),
                          SchedulerConfig(gpu_memory_utilization=0.8), concurrency=1)


def test_scheduler_defaults_follow_the_servers():
    h100, a100 = H100.gpu, load_cluster("dgx-a100-80gb").gpu
    assert (scheduler_defaults("vllm", h100).token_budget, scheduler_defaults("vllm", h100).max_num_seqs) == (8192, 1024)
    assert (scheduler_defaults("vllm", a100).token_budget, scheduler_defaults("vllm", a100).max_num_seqs) == (2048, 256)
    assert scheduler_defaults("sglang", h100).token_budget == 8192
    assert scheduler_defaults("sglang", load_cluster("dgx-b200").gpu).token_budget == 16384
    t = scheduler_defaults("tensorrt-llm", h100)
    assert (t.token_budget, t.max_num_seqs, t.block_tokens, t.reserve) == (8192, 2048, 32, "full")
    assert scheduler_defaults("vllm", h100, token_budget=2048, max_num_seqs=None).token_budget == 2048


def test_lockstepped_expert_parallel_replicas_mix_more_often():
    rep = _rep(model="mixtral-8x7b", tp=1, dp=8, ep=8, P=2000, O=500)
    s = inflight_point(rep.sm, rep.sched, 16.0)
    d, P, O = 16.0, 2000, 500
    f_one = d * P / (O - 1) / s.chunk_tokens
    assert s.mixed_fraction == pytest.approx(1 - (1 - f_one) ** 8)


def test_disaggregated_estimate_adds_up():
    m, c = get_model("llama-3.1-70b"), H100.with_gpus(8)
    sched = scheduler_defaults("vllm", c.gpu)
    est = estimate_disaggregated(m, c, _wl(), Pool(2, 1, 1, 2), Pool(4, 1, 1, 1), sched, decode_batch=40)
    s = est.schedule
    dis = s["disaggregation"]
    O = 200
    X = s["request_rate_per_s"]
    assert X == pytest.approx(1 * 40 / (O * s["decode_step_s"]))
    assert est.tpot_s == s["decode_step_s"]
    assert est.ttft_s == pytest.approx(s["queue_s"] + s["prefill_s"] + dis["kv_transfer_s"] + 1.5 * s["decode_step_s"])
    assert dis["prefill"]["utilization"] == pytest.approx(X * dis["prefill"]["service_per_prompt_s"] / 2)
    assert s["concurrency"] == pytest.approx(X * (est.ttft_s + (O - 1) * est.tpot_s))
    assert est.output_tokens_per_s_per_gpu == pytest.approx(X * O / 8)
    assert dis["kv_transfer_tier"] == "nvlink"                # one node
    # over two nodes the KV cache goes over the network, which is slower
    c16 = H100.with_gpus(16)
    far = estimate_disaggregated(m, c16, _wl(), Pool(4, 1, 1, 2), Pool(4, 1, 1, 2), sched, decode_batch=40)
    assert far.schedule["disaggregation"]["kv_transfer_tier"] == "network"
    # twice the GPU pairs in parallel, each over a link ~8x slower than NVLink
    assert far.schedule["disaggregation"]["kv_transfer_s"] > dis["kv_transfer_s"] * 3
    # a prefill pool that cannot keep up is refused
    with pytest.raises(SpecError, match="cannot keep up"):
        estimate_disaggregated(get_model("llama-3.1-8b"), c, _wl(P=4000, O=50), Pool(1, 1, 1, 1), Pool(1, 1, 1, 7),
                               sched, decode_batch=100)


def test_estimate_serving_rebuilds_each_regime():
    m, c = get_model("llama-3.1-70b"), H100.with_gpus(8)
    par = ParallelConfig(tp=4, dp=2)
    sched = scheduler_defaults("vllm", c.gpu)
    e = estimate_inflight(m, c, _wl(), par, sched, decode_batch=30)
    again = estimate_serving(m, c, _wl(), par, {"batching": "inflight", "scheduler": sched.to_dict(),
                                                "operating_point": {"decode_batch": 30}})
    assert again.ttft_s == e.ttft_s and again.tpot_s == e.tpot_s
    static = estimate_serving(m, c, _wl(), par, {})
    assert static.batching == "static"


# --------------------------------------------------------------------------------------
# Against servers under load (calibration/published_inference_serving.yaml)
# --------------------------------------------------------------------------------------

def _serving_rows():
    from planner.cli.validation_inference import serving_rows
    return serving_rows()


def test_published_servers_under_load():
    """NVIDIA NIM (TensorRT-LLM) at 1..250 concurrent users, five prompt/output mixes, 8B and 70B on
    H100: ITL and throughput from the steady state, nothing fitted to them."""
    import statistics
    rows = _serving_rows()
    assert len(rows) >= 70
    itl = [abs(r["tpot_ms"] / r["itl_ms"] - 1) for r in rows]
    thr = [abs(r["tokens_per_s_pred"] / r["tokens_per_s"] - 1) for r in rows]
    assert statistics.median(itl) <= 0.10 and sum(e <= 0.2 for e in itl) >= 0.9 * len(rows)
    assert statistics.median(thr) <= 0.10 and sum(e <= 0.2 for e in thr) >= 0.85 * len(rows)
    # a lone user's first token
    one = [abs(r["ttft_steady_ms"] / r["ttft_ms"] - 1) for r in rows if r["concurrency"] == 1]
    assert statistics.median(one) <= 0.2
    # where the KV cache caps the running requests, the extra users queue: the TTFT of seconds to
    # minutes that the benchmark measured follows from the block manager's capacity
    queued = [r for r in rows if r["concurrency"] > 1.5 * r["max_running"]]
    assert len(queued) >= 10
    assert all(0.6 <= r["ttft_steady_ms"] / r["ttft_ms"] <= 1.4 for r in queued)


def test_maximum_throughput_does_not_get_worse_in_flight():
    """Every maximum-throughput figure of the static tables, predicted in flight too: no further off."""
    from planner.cli.validation_inference import validation_rows
    rows = validation_rows()
    static = {r.case: r for r in rows if r.metric == "output tokens/s per GPU"}
    inflight = {r.case: r for r in rows if r.metric == "output tokens/s per GPU, in flight"}
    assert static and set(static) == set(inflight)
    for case, r in static.items():
        assert abs(inflight[case].error) <= abs(r.error) + 0.005, case
