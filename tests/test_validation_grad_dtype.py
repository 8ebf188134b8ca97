"""Published runs whose source reduces gradients in bf16 say so (``profile: {grads_bf16: true}``), each
record quotes the setting it read, and the switch reaches the estimate that ``planner validate`` makes
(through the accepting target's profile, ``validation._with_overrides``)."""
from __future__ import annotations

import copy

import pytest

from planner.cli import validation

CASES = [c for c, _split in validation.all_cases()]
BF16_GRADS = [c for c in CASES if (c.get("profile") or {}).get("grads_bf16")]
# the settings that put a run's gradients in bf16: Megatron-core's DDP / NeMo's precision plugin, Apex's
# distributed Adam (NeMo 1.x: its YAML key, or the launcher's Hydra override of it), InternLM's HybridZeroOptimizer
# (its reduce in the parameters' dtype), FSDP2's MixedPrecisionPolicy (Lightning-Thunder's benchmark); a record may
# claim bf16 gradients only by quoting one of them
SETTINGS = ("grad_reduce_in_fp32=False", "grad_sync_dtype: bf16", "optim.grad_sync_dtype=bf16",
            "reduce_tensor(tensor=flat, dtype=self.dtype", "reduce_dtype=torch.bfloat16")


def test_the_mlperf_runs_that_set_it_are_marked():
    """The MLPerf Llama 3.1 (v5.0 405B, v5.1 and v6.0 8B; v5.1 and v6.0 405B and v5.1 8B in NVFP4), DeepSeek-V3 (v6.0) and
    GPT-3 (v3.0, v3.1, v4.1) rows all ran with bf16 gradients (their submissions' pretrain.py /
    distributed_fused_adam.yaml); none may lose the mark."""
    names = {c["name"] for c in BF16_GRADS}
    mlperf = {c["name"] for c in CASES if c["name"].startswith(("mlperf30-", "mlperf31-", "mlperf41-", "mlperf50-",
                                                                 "mlperf51-", "mlperf60-"))}
    assert len(mlperf) == 74          # 59 FP8 and BF16 runs, 15 NVFP4 runs (stop 51)
    assert mlperf <= names, sorted(mlperf - names)


@pytest.mark.parametrize("case", BF16_GRADS, ids=lambda c: c["name"])
def test_each_bf16_gradient_record_quotes_its_source_setting(case):
    said = " ".join(str(a) for a in case.get("assumed", []))
    assert any(s in said for s in SETTINGS), "quote the source line that sets the gradient dtype"
    assert case.get("dtype") in ("bf16", "fp8", "nvfp4"), "bf16 gradients only with 16-bit, FP8 or NVFP4 training"


@pytest.mark.parametrize("name", ["mlperf51-uf-llama3.1-8b-b200-64gpu-fp8", "mlperf31-gpt3-175b-h100-4096gpu-fp8"])
def test_the_switch_reaches_the_priced_step(name):
    """The record as written against the same record without its profile: the profile survives the
    target's override (case_inputs, then case_rows' accepting target) and halves the bytes each
    gradient reduce-scatter moves, so the priced step is shorter; nothing else in the record differs."""
    case = next(c for c in CASES if c["name"] == name)
    plain = copy.deepcopy(case)
    del plain["profile"]
    *_, prof, _fw = validation.case_inputs(case)
    assert prof.grads_bf16 and not validation.case_inputs(plain)[4].grads_bf16
    target_prof = validation.FRAMEWORKS["megatron"]
    assert validation._with_overrides(prof, target_prof).grads_bf16

    def step(c):
        rows = validation.case_rows(c, "test")
        assert rows, validation.REFUSED.get(c["name"])
        return next(r.predicted for r in rows if r.metric == "step time (s)")
    with_bf16, with_fp32 = step(case), step(plain)
    assert with_bf16 < with_fp32


def test_nemo_2407_fp8_runs_fit_once_their_gradients_are_bf16():
    """NeMo 24.07's H100 FP8 example scripts for GPT-3 and Llama set ``grad_sync_dtype=bf16`` (Apex's distributed
    Adam: a full-size bf16 gradient buffer). Priced with Megatron's fp32 buffer, three of those runs, which ran
    on 80 GB H100s, did not fit by the model's count (GPT-3 20B on 64 GPUs at 94 GiB); as recorded, each fits,
    and with an fp32 buffer the 20B one again does not."""
    from costmodel.training import estimate
    nemo = [c for c in BF16_GRADS if c["name"].startswith("nemo2407-h100-fp8-")]
    assert len(nemo) == 9 and not any("nemotron" in c["name"] for c in nemo)   # the Nemotron scripts leave it fp32
    for c in nemo:
        m, cl, wl, par, prof, _fw = validation.case_inputs(c)
        assert estimate(m, cl, wl, par, framework=prof).fits, c["name"]
    plain = copy.deepcopy(next(c for c in nemo if c["name"] == "nemo2407-h100-fp8-gpt3-20b-64gpu"))
    del plain["profile"]
    m, cl, wl, par, prof, _fw = validation.case_inputs(plain)
    assert not estimate(m, cl, wl, par, framework=prof).fits
