"""The serving cost model (costmodel/inference.py): formulas, invariants, published figures."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.inference import (InferenceEstimate, check_invariants, estimate_inference, expected_experts_touched,
                                 kv_bytes_per_token, serving_max_batch, soft_roofline)
from costmodel.specs import ParallelConfig, SpecError, Workload
from costmodel.files.clusters import load_cluster

TOLERANCE = 0.20     # the bar for the published serving figures


def wl(batch=1, prompt=512, output=128, dtype="bf16", kv=""):
    return Workload(global_batch=batch, seq_len=prompt + output, mode="infer", dtype=dtype, prompt_len=prompt,
                    output_len=output, kv_dtype=kv)


def est(model="llama-3-70b", cluster="dgx-h100", gpus=8, w=None, **par) -> InferenceEstimate:
    e = estimate_inference(get_model(model), load_cluster(cluster).with_gpus(gpus), w or wl(), ParallelConfig(**par))
    check_invariants(e)
    return e


# ---- the KV-cache formula ------------------------------------------------------------------

def test_kv_bytes_per_token_published_examples():
    # calibration/published_inference.yaml: 2 x layers x kv_heads x head_dim x bytes
    assert kv_bytes_per_token(get_model("llama-3-70b"), "bf16") == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv_bytes_per_token(get_model("llama-2-7b"), "fp16") == 2 * 32 * 32 * 128 * 2 == 524_288


def test_kv_split_over_tp_heads_and_pp_layers_replicated_past_kv_heads():
    m = get_model("llama-3-70b")
    assert kv_bytes_per_token(m, "bf16", tp=8) == 327_680 / 8
    assert kv_bytes_per_token(m, "bf16", tp=8, pp=2) == 327_680 / 16
    assert kv_bytes_per_token(m, "bf16", tp=16) == 327_680 / 8       # one KV head per GPU, replicated
    assert kv_bytes_per_token(m, "fp8") == 327_680 / 2
    e = est(tp=8, w=wl(batch=4, prompt=1000, output=24))
    assert e.kv_cache_bytes_per_token == 327_680 / 8
    assert e.kv_cache_bytes_per_gpu == pytest.approx(4 * 1024 * 327_680 / 8)
    assert e.memory["kv_cache_bytes"] == e.kv_cache_bytes_per_gpu


def test_mla_compressed_cache_is_not_split_by_tp():
    m = get_model("deepseek-v3")
    per_layer = (512 + 64) * 1        # kv_lora_rank + qk_rope_head_dim, fp8
    assert kv_bytes_per_token(m, "fp8") == 61 * per_layer
    assert kv_bytes_per_token(m, "fp8", tp=8) == 61 * per_layer
    # far smaller than a full MHA cache of the same 128 heads of 192 + 128 dims
    assert kv_bytes_per_token(m, "fp8") < 61 * 128 * (192 + 128) / 50


# ---- invariants ------------------------------------------------------------------------------

def test_single_gpu_has_no_communication_and_dense_no_expert_time():
    e = est(model="llama-3-8b", gpus=1, tp=1)
    t = e.time
    assert t["decode_tp_comm_s"] == t["prefill_tp_comm_s"] == 0
    assert t["decode_pp_comm_s"] == t["prefill_pp_comm_s"] == 0
    assert t["decode_ep_comm_s"] == t["prefill_ep_comm_s"] == 0
    assert est(model="llama-3-8b", gpus=2, tp=2).time["decode_tp_comm_s"] > 0
    assert est(model="llama-3-8b", gpus=2, pp=2).time["decode_pp_comm_s"] > 0
    assert est(model="mixtral-8x7b", gpus=8, tp=2, dp=4, ep=8).time["decode_ep_comm_s"] > 0


def test_decode_step_parts_add_up():
    for par in (dict(tp=8), dict(tp=4, pp=2), dict(pp=8)):
        e = est(w=wl(batch=64), **par)
        t = e.time
        parts = sum(t[k] for k in ("decode_gemm_s", "decode_attention_s", "decode_elementwise_s", "decode_overhead_s",
                                   "decode_tp_comm_s", "decode_ep_comm_s", "decode_pp_comm_s",
                                   "decode_pipeline_wait_s"))
        assert parts == pytest.approx(e.tpot_s, rel=1e-9), par
        pre = sum(t[k] for k in ("prefill_gemm_s", "prefill_attention_s", "prefill_elementwise_s",
                                 "prefill_overhead_s", "prefill_tp_comm_s", "prefill_ep_comm_s", "prefill_pp_comm_s"))
        assert pre == pytest.approx(t["prefill_s"], rel=1e-9), par


def test_more_sharding_never_more_memory_per_gpu():
    prev = None
    for tp in (1, 2, 4, 8):
        e = est(model="llama-3-8b", gpus=tp, tp=tp, w=wl(batch=8))
        if prev is not None:
            assert e.memory["weights_bytes"] < prev.memory["weights_bytes"]
            assert e.memory["kv_cache_bytes"] < prev.memory["kv_cache_bytes"]
            assert e.peak_bytes < prev.peak_bytes
            assert e.max_batch >= prev.max_batch
        prev = e
    assert est(gpus=8, tp=4, pp=2).memory["weights_bytes"] < est(gpus=8, tp=4, dp=2).memory["weights_bytes"]


def test_latency_grows_with_batch_and_prompt_throughput_with_batch():
    es = [est(model="llama-3-8b", gpus=1, w=wl(batch=b)) for b in (1, 4, 16, 64)]
    assert all(a.tpot_s < b.tpot_s for a, b in zip(es, es[1:]))
    assert all(a.output_tokens_per_s < b.output_tokens_per_s for a, b in zip(es, es[1:]))
    ps = [est(model="llama-3-8b", gpus=1, w=wl(prompt=p)) for p in (128, 1024, 4096)]
    assert all(a.ttft_s < b.ttft_s for a, b in zip(ps, ps[1:]))
    # attention is quadratic in the prompt: 4x the prompt is more than 4x the attention time
    a1, a4 = (x.time["prefill_attention_s"] for x in ps[1:])
    assert a4 > 4.5 * a1


def test_decode_is_bound_by_reading_the_weights_at_batch_one():
    e = est(model="llama-3-8b", gpus=1)
    w_read = e.memory["weights_bytes"] / (load_cluster("dgx-h100").gpu.hbm_bandwidth_bytes_per_s)
    assert w_read < e.tpot_s < 1.6 * w_read
    assert e.time["decode_weights_s"] > 10 * e.time["decode_compute_s"]


def test_tp_all_reduce_is_latency_bound_at_batch_one():
    e1 = est(gpus=8, tp=8, w=wl(batch=1))
    e8 = est(gpus=8, tp=8, w=wl(batch=8))
    # 8x the bytes, nearly the same time: a 16 KB all-reduce is latency
    assert e8.time["decode_tp_comm_s"] < 1.2 * e1.time["decode_tp_comm_s"]


def test_moe_reads_only_touched_experts_at_small_batch():
    assert expected_experts_touched(8, 2, 1) == pytest.approx(2)
    assert expected_experts_touched(256, 8, 1) == pytest.approx(8)
    assert expected_experts_touched(256, 8, 10_000) == pytest.approx(256)
    b1 = est(model="mixtral-8x7b", gpus=2, tp=2, w=wl(batch=1))
    b64 = est(model="mixtral-8x7b", gpus=2, tp=2, w=wl(batch=64))
    # batch 1: 2 of 8 experts; batch 64: all of them
    assert b1.time["decode_weights_s"] < 0.45 * b64.time["decode_weights_s"]


def test_weight_dtypes_scale_weights_and_kv_dtype_the_cache():
    m = {d: est(model="llama-3-8b", gpus=1, w=wl(dtype=d)).memory for d in ("bf16", "fp8", "int4")}
    assert m["fp8"]["weights_bytes"] < 0.6 * m["bf16"]["weights_bytes"]
    assert m["int4"]["weights_bytes"] < 0.7 * m["fp8"]["weights_bytes"]
    assert m["int4"]["kv_cache_bytes"] == m["bf16"]["kv_cache_bytes"]    # weight-only quantization
    kv8 = est(model="llama-3-8b", gpus=1, w=wl(kv="fp8")).memory["kv_cache_bytes"]
    assert kv8 == m["bf16"]["kv_cache_bytes"] / 2


def test_max_batch_is_the_largest_that_fits():
    m, c = get_model("llama-3-70b"), load_cluster("dgx-h100").with_gpus(8)
    par = ParallelConfig(tp=8)
    mb = serving_max_batch(m, c, wl(prompt=4000, output=1000), par)
    assert mb > 10
    fit = estimate_inference(m, c, wl(batch=mb, prompt=4000, output=1000), par)
    over = estimate_inference(m, c, wl(batch=mb + 1, prompt=4000, output=1000), par)
    assert fit.fits and fit.peak_bytes <= c.gpu.memory_bytes < over.peak_bytes and not over.fits
    assert fit.max_batch == mb


def test_pipeline_decode_step_is_the_ring_or_the_slowest_stage():
    one = est(gpus=8, tp=4, pp=2, w=wl(batch=1))
    # batch 1 goes round the ring: both stages and two hand-offs
    assert one.tpot_s == pytest.approx(sum(s["decode_s"] for s in one.stages) + one.time["decode_pp_comm_s"])
    many = est(gpus=8, tp=4, pp=2, w=wl(batch=64))
    assert many.tpot_s >= 2 * max(s["decode_s"] for s in many.stages)


def test_impossible_serving_configurations_are_refused():
    with pytest.raises(SpecError, match="max_seq_len"):
        est(model="llama-3-8b", gpus=1, w=wl(prompt=8000, output=1000))
    with pytest.raises(SpecError, match="tp 3"):
        est(model="llama-3-8b", gpus=3, tp=3)
    with pytest.raises(SpecError, match="has no experts"):
        est(model="llama-3-8b", gpus=2, dp=2, ep=2)
    with pytest.raises(SpecError, match="multiple of tp"):
        est(model="mixtral-8x7b", gpus=8, tp=4, dp=2, ep=2)
    with pytest.raises(SpecError, match="prompt_len"):
        estimate_inference(get_model("llama-3-8b"), load_cluster("dgx-h100").with_gpus(1),
                           Workload(global_batch=1, seq_len=10, mode="infer"), ParallelConfig())


def test_soft_roofline_between_max_and_sum():
    assert soft_roofline(1.0, 1.0) == pytest.approx(2 ** 0.5)
    assert soft_roofline(3.0, 0.0) == 3.0
    assert max(2.0, 0.5) < soft_roofline(2.0, 0.5) < 2.5


def test_to_dict_has_the_contract_keys():
    d = est(tp=8).to_dict()
    for k in ("ttft_s", "tpot_s", "output_tokens_per_s", "output_tokens_per_s_per_gpu", "max_batch",
              "kv_cache_bytes_per_gpu", "memory", "time"):
        assert k in d
    assert set(d["memory"]) == {"peak_bytes", "weights_bytes", "kv_cache_bytes", "activations_bytes", "other_bytes"}


# ---- published figures -------------------------------------------------------------------------

def _rows():
    from planner.cli.validation_inference import validation_rows
    return validation_rows()


ROWS = _rows()


@pytest.mark.parametrize("row", [r for r in ROWS if r.split == "calibration"], ids=lambda r: f"{r.case}:{r.metric}")
def test_published_serving_figures_within_20_percent(row):
    assert abs(row.error) <= TOLERANCE, (f"{row.case} {row.metric}: published {row.published}, predicted "
                                         f"{row.predicted:.4g} ({row.error * 100:+.1f}%)")


def test_every_calibration_case_and_metric_is_checked():
    import yaml

    from planner.cli.validation_inference import CALIBRATION
    cases = yaml.safe_load(CALIBRATION.read_text())["cases"]
    names = {r.case.split(" (")[0] for r in ROWS if r.split == "calibration"}
    assert names == {c["name"] for c in cases}
    metrics = {r.metric for r in ROWS}
    assert {"prefill (ms)", "decode (ms per token)", "first token (ms)", "output tokens/s per GPU"} <= metrics


def test_validation_table_is_current():
    from planner.cli.validation_inference import VALIDATION_DOC, validation_markdown
    assert VALIDATION_DOC.read_text() == validation_markdown(ROWS), (
        "costmodel/VALIDATION_INFERENCE.md is stale: run "
        "`python -m planner.cli.validation_inference --write-validation costmodel/VALIDATION_INFERENCE.md`")


def test_unknown_gpu_dtype_falls_back_to_16_bit_compute():
    # A100 has no fp8 tensor cores: fp8 weights are read as 1 byte and multiplied in 16 bit
    e = est(model="llama-3-8b", cluster="dgx-a100-80gb", gpus=1, w=wl(dtype="fp8"))
    e16 = est(model="llama-3-8b", cluster="dgx-a100-80gb", gpus=1, w=wl(dtype="bf16"))
    assert e.tpot_s < e16.tpot_s
    assert e.time["prefill_compute_s"] == pytest.approx(e16.time["prefill_compute_s"], rel=1e-6)
    assert dataclasses.replace(wl(), kv_dtype="fp8").kv_dtype == "fp8"
