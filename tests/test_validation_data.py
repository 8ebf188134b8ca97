"""The public runs added for issue 23 item 4 load, are priced, and their derived figures follow from
their sources' own figures (``calibration/published_runs_more.yaml``, ``calibration/clusters/``)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from costmodel.files.clusters import load_cluster
from planner.cli import validation
from planner.cli.validation_families import family_of

ROOT = Path(__file__).resolve().parents[1]
MORE = yaml.safe_load(validation.MORE_RUNS.read_text())["cases"]
BY_NAME = {c["name"]: c for c in MORE}


def test_case_names_are_unique_across_files():
    names = [c["name"] for c, _split in validation.all_cases()]
    dup = sorted({n for n in names if names.count(n) > 1})
    # the MoE file repeats one Megatron README run on purpose (its own split); nothing else may repeat
    assert set(dup) <= {"mlm-moe-mixtral-8x7b-h100-64gpu"}, dup


ON_FILES = [c for c, _split in validation.all_cases() if str(c["cluster"]).endswith(".yaml")]


@pytest.mark.parametrize("case", ON_FILES, ids=lambda c: c["name"])
def test_cluster_files_state_only_what_the_catalog_lacks(case):
    """A case on a cluster file: the file lives in calibration/clusters/, extends a catalog cluster
    with the same GPU, and differs from it in the network the source states (else the catalog name
    would do; the network may be the links between nodes or the nodes' size and NVLink). The same GPU may
    carry its own name where its die and curve are the catalog one's
    (the A800: the A100 with NVLink cut, ``validation_cross.CURVE_OF``). A machine reported apart
    (``validation.hardware_matches`` false: another part of the same die, as TSUBAME 4.0's H100 SXM5
    94GB HBM2e and Meta's Grand Teton H100s) may also restate the part's memory and bandwidth and the
    power limit it runs at, never its peaks or its curve; such a file differs from the catalog in the
    network or in the part."""
    import dataclasses

    from planner.cli.validation_cross import CURVE_OF
    from planner.cli.validation_families import generation
    path = ROOT / case["cluster"]
    assert path.parent == ROOT / "calibration" / "clusters" and path.exists(), case["cluster"]
    parent = yaml.safe_load(path.read_text())["extends"]
    mine, cat = validation.case_cluster(case), load_cluster(parent)
    gpu, cat_gpu = mine.groups[0].gpu, cat.groups[0].gpu
    if gpu.name != cat_gpu.name:
        assert CURVE_OF.get(generation(gpu.name), generation(gpu.name)) == generation(cat_gpu.name)
        gpu = dataclasses.replace(gpu, name=cat_gpu.name)
    part_differs = False
    if not validation.hardware_matches(case):
        restated = dataclasses.replace(gpu, memory_bytes=cat_gpu.memory_bytes, power_limit_w=cat_gpu.power_limit_w,
                                       hbm_bandwidth_bytes_per_s=cat_gpu.hbm_bandwidth_bytes_per_s)
        part_differs = restated != gpu
        gpu = restated
    assert gpu == cat_gpu
    # the network: a slower link between nodes, or nodes of another size and NVLink (the Kempner H200 nodes of 4)
    node_differs = (mine.groups[0].gpus_per_node != cat.groups[0].gpus_per_node
                    and mine.intra_node != cat.intra_node)
    assert (mine.inter_node.bandwidth_bytes_per_s < cat.inter_node.bandwidth_bytes_per_s or part_differs
            or node_differs)
    assert str(case.get("hardware_note", "")).strip(), "say how the machines differ from the catalog's"


@pytest.mark.parametrize("case", [c for c in MORE if c.get("derived_from")], ids=lambda c: c["name"])
def test_derived_figures_follow_from_the_sources_own(case):
    """tokens/s a source does not print: recomputed from the figures on file it was derived from."""
    d = case["derived_from"]
    base = BY_NAME[d["case"]]
    got, tps0 = case["reported"]["tokens_per_s_per_gpu"], base["reported"]["tokens_per_s_per_gpu"]
    if "gain_pct" in d:
        want = tps0 * (1 + d["gain_pct"] / 100)
    else:
        assert d.get("mfu_ratio") is True
        want = tps0 * case["reported"]["mfu"] / base["reported"]["mfu"]
    assert got == pytest.approx(want, abs=0.5)
    # same model, sequence and per-GPU batch as the run it is derived from
    assert case["model"] == base["model"]
    assert case["global_batch"] / case["num_gpus"] == base["global_batch"] / base["num_gpus"]


def test_every_added_case_is_priced_and_has_a_family():
    """No new case is refused, skipped by --cross, or left without a recipe family."""
    from planner.cli.validation_cross import load_cases
    validation.REFUSED.clear()
    rows = validation.all_rows(include_holdout=False)
    # a source that prints only TFLOP/s (OPT-175B's hardware count) is priced on that figure
    priced = {r.case for r in rows if r.metric in ("tokens/s per GPU", "step time (s)") or r.metric.endswith("TFLOP/s per GPU")}
    cases, skipped = load_cases()
    cross = {c.name for c in cases}
    for c in MORE:
        assert c["name"] in priced, (c["name"], validation.REFUSED.get(c["name"]))
        assert c["name"] in cross, [s for s in skipped if s.startswith(c["name"])]
        assert family_of(c["source"]) != "other", c["name"]


def test_ibm_fsdp_cases_read_as_the_posts_print_them():
    """Spot checks against the posts (March post Table 1; May post Tables 1-2): a changed figure on
    file fails here, not silently in the refit."""
    rep = {n: c["reported"] for n, c in BY_NAME.items() if n.startswith("ibm-fsdp-")}
    assert rep["ibm-fsdp-llama2-7b-a100-128gpu"] == {"tokens_per_s_per_gpu": 3700, "mfu": 0.57}
    assert rep["ibm-fsdp-llama2-70b-h100-96gpu"] == {"tokens_per_s_per_gpu": 800, "mfu": 0.34}
    assert rep["ibm-fsdp-llama2-7b-a100-128gpu-compile"]["mfu"] == 0.68
    assert rep["ibm-fsdp-llama2-70b-h100-464gpu"]["mfu"] == 0.32
    assert len(rep) == 20


def test_olmo_core_cases_read_as_the_readme_prints_them():
    """allenai/OLMo-core README at e27ba74550: TPS per device, BF16 and BF16/FP8, and the per-rank
    micro-batch and global batch of each script at that commit."""
    got = {n: (c["reported"]["tokens_per_s_per_gpu"], c["parallel"]["micro_batch"], c["global_batch"], c["dtype"])
           for n, c in BY_NAME.items() if n.startswith("olmo-core-")}
    assert got == {
        "olmo-core-olmo2-1b-h100-8gpu-bf16": (55000, 8, 1024, "bf16"),
        "olmo-core-olmo2-1b-h100-8gpu-fp8": (65000, 8, 1024, "fp8"),
        "olmo-core-olmo2-7b-h100-8gpu-bf16": (10000, 2, 1024, "bf16"),
        "olmo-core-olmo2-7b-h100-8gpu-fp8": (13000, 2, 1024, "fp8"),
        "olmo-core-llama3-8b-h100-8gpu-bf16": (9500, 2, 1024, "bf16"),
        "olmo-core-llama3-8b-h100-8gpu-fp8": (12500, 2, 1024, "fp8"),
        "olmo-core-olmo2-13b-h100-8gpu-bf16": (4600, 1, 2048, "bf16"),
        "olmo-core-olmo2-13b-h100-8gpu-fp8": (5500, 1, 2048, "fp8"),
    }


def test_mlperf_cases_read_as_the_logs_print_them():
    """MLPerf Training v3.1 GPT-3 175B (NVIDIA, Eos): the median train_step_timing per scale, and a
    layout whose degrees multiply to the GPU count with the log's global batch."""
    got = {c["num_gpus"]: (c["reported"]["step_time_s"], c["global_batch"]) for n, c in BY_NAME.items()
           if n.startswith("mlperf31-")}
    assert got == {512: (11.0539, 2048), 4096: (1.6084, 2048), 6144: (1.6152, 3072), 8192: (1.6192, 4096),
                   10240: (0.9256, 2560), 10752: (0.9296, 2688)}
    v30 = {c["num_gpus"]: c["reported"]["step_time_s"] for n, c in BY_NAME.items() if n.startswith("mlperf30-gpt3-175b-h100")}
    assert v30 == {512: 12.0744, 768: 12.1275}
    v51 = {(c["cluster"], c["num_gpus"]): c["reported"]["step_time_s"] for n, c in BY_NAME.items()
           if n.startswith("mlperf51-llama") and c["dtype"] != "nvfp4"}
    assert v51 == {("gb200-nvl72", 72): 0.1711, ("gb200-nvl72", 512): 0.089, ("gb300-nvl72", 72): 0.1473,
                   ("gb300-nvl72", 512): 0.0855}
    # stop 51: NVIDIA's NVFP4 runs, the per-file medians' median (the records' assumed)
    fp4 = {n: (c["num_gpus"], c["global_batch"], c["reported"]["step_time_s"]) for n, c in BY_NAME.items()
           if c.get("dtype") == "nvfp4" and n.startswith(("mlperf51-llama", "mlperf60-llama"))}
    assert fp4 == {"mlperf51-llama3.1-405b-gb300-512gpu-nvfp4": (512, 1152, 13.1447),
                   "mlperf51-llama3.1-405b-gb200-512gpu-nvfp4": (512, 1152, 17.2592),
                   "mlperf51-llama3.1-405b-gb200-2560gpu-nvfp4": (2560, 960, 3.1896),
                   "mlperf51-llama3.1-405b-gb200-5120gpu-nvfp4": (5120, 1280, 2.2271),
                   "mlperf51-llama3.1-8b-gb300-8gpu-nvfp4": (8, 16, 0.3466),
                   "mlperf51-llama3.1-8b-gb200-8gpu-nvfp4": (8, 16, 0.4055),
                   "mlperf60-llama3.1-405b-gb300-2048gpu-nvfp4": (2048, 1024, 3.1086)}
    uf = {c["num_gpus"]: c["reported"]["step_time_s"] for n, c in BY_NAME.items() if n.startswith("mlperf51-uf-llama3.1-8b")}
    assert uf == {8: 0.5441, 16: 0.5751, 32: 0.1886, 64: 0.1895, 128: 0.1928, 256: 0.2212}
    # stop 28: the per-file medians' median of HPE's, Lambda's and UF's 405B result files (the records' assumed)
    more = {n: (c["num_gpus"], c["global_batch"], c["reported"]["step_time_s"]) for n, c in BY_NAME.items()
            if n.startswith(("mlperf51-hpe-", "mlperf51-lambda-", "mlperf51-uf-llama3.1-405b"))}
    assert more == {"mlperf51-hpe-llama3.1-8b-h200-64gpu-fp8": (64, 32, 0.353),
                    "mlperf51-lambda-llama3.1-8b-gb300-72gpu-fp8": (72, 36, 0.1611),
                    "mlperf51-uf-llama3.1-405b-b200-256gpu-fp8": (256, 576, 27.645),
                    "mlperf51-uf-llama3.1-405b-b200-448gpu-fp8": (448, 1008, 27.971)}
    for n, c in BY_NAME.items():
        if n.startswith("mlperf"):
            p = c["parallel"]
            assert p["tp"] * p["pp"] * p["dp"] * p.get("cp", 1) == c["num_gpus"]
            assert c["global_batch"] % p["dp"] == 0


def test_an_unpublished_micro_batch_on_smp_is_the_whole_per_rank_batch():
    """SageMaker model parallel's ``microbatches`` defaults to 1 (no split of a rank's batch), so an
    SMP run that publishes only its global batch runs global / dp sequences per rank in one pass:
    BloombergGPT's 2048 over 512 ranks is 4, no accumulation; every other trainer keeps 1 (Megatron's)."""
    bb = BY_NAME["bloomberggpt-50b-a100-40gb-512gpu"]
    assert "micro_batch" not in bb["parallel"]
    assert validation.default_micro_batch(bb, 512) == 2048 // 512
    _, _, _, par, _, _ = validation.case_inputs(bb)
    assert (par.micro_batch, par.grad_accum) == (4, 1)
    with_pp = dict(bb, parallel=dict(bb["parallel"], pp=2))
    assert validation.default_micro_batch(with_pp, 256) == 1
    other = dict(bb, execution={"trainer": "Megatron-LM"})
    assert validation.default_micro_batch(other, 512) == 1


def test_smollm3_figure_is_the_playbooks_steady_rate():
    """The Smol Training Playbook's 13,500-14,000 tokens/s per GPU (midpoint compared); the README's wall
    clock, 4,720,000 x 576 x 4096 tokens over 384 GPUs and 24 days, is within 2% of it."""
    c = BY_NAME["smollm3-3b-h100-384gpu-bf16"]
    assert c["reported"]["tokens_per_s_per_gpu"] == (13_500 + 14_000) / 2
    wall = 4_720_000 * 576 * 4096 / (384 * 24 * 86_400)
    assert wall == pytest.approx(13_985, abs=1)
    assert abs(wall / c["reported"]["tokens_per_s_per_gpu"] - 1) < 0.02


def test_aleph_alpha_cases_reproduce_the_papers_headline():
    """Hagemann et al.'s sheets print no global batch; the records take 2^22 tokens, derived from the
    sheets' own columns. With it the 13B run on 64 GPUs (step 26.5395 s) gives the paper's headline MFU,
    70.5%, by its count (6N with both 128k embedding matrices + 12 l h s per token, 312 TFLOP/s); a
    different batch would not. Every case of the family is one sweep's: 2^22 tokens, A100 80GB, ZeRO-1,
    the gradient reduction not overlapped."""
    cases = [c for c in MORE if family_of(c["source"]) == "aleph-alpha"]
    assert len(cases) == 16
    for c in cases:
        assert c["global_batch"] * c["model"]["seq_len"] == 2 ** 22
        assert c["cluster"] == "dgx-a100-80gb" and c["parallel"]["zero"] == 1
        assert c["profile"]["overlap_grad_reduce"] is False
    c = BY_NAME["aa-llama13b-a100-64gpu-tp1-pp1-mb1"]
    m = c["model"]
    h, L, f, v, s = m["hidden"], m["layers"], m["ffn_hidden"], m["vocab"], m["seq_len"]
    n = L * (4 * h * h + 3 * h * f + 2 * h) + 2 * v * h + h          # LLaMA-13B shape, untied 128k embeddings
    tokens_per_gpu = 2 ** 22 / (c["reported"]["step_time_s"] * c["num_gpus"])
    mfu = tokens_per_gpu * (6 * n + 12 * L * h * s) / 312e12
    assert mfu == pytest.approx(0.705, abs=0.001)


def _records_and_cases(prefix: str, published: dict | None = None) -> tuple[dict, dict]:
    """The records whose name starts with ``prefix`` and the validation's priced cases of them (every record
    priced: none refused); ``published``: each record's tokens/s per GPU, as its source prints it."""
    from planner.cli.validation_cross import load_cases
    rows = {n: c for n, c in BY_NAME.items() if n.startswith(prefix)}
    cases = {c.name: c for c in load_cases()[0] if c.name in rows}
    assert rows and set(cases) == set(rows)
    if published is not None:
        assert {n: c["reported"]["tokens_per_s_per_gpu"] for n, c in rows.items()} == published
    return rows, cases


FP8_GATHER = [c for c in MORE if c.get("fp8_param_gather")]


def test_fp8_weight_gather_is_priced_where_the_runs_files_set_it():
    """A record that says ``fp8_param_gather`` (its files gather the weights in FP8) is priced so: the
    data-parallel all-gather moves one byte per weight, so its gather takes less time than the same run
    priced with bf16 weights; each such record says where its files set it."""
    import dataclasses

    from costmodel.training import estimate
    assert len(FP8_GATHER) >= 30
    for c in FP8_GATHER:
        assert c["dtype"] == "fp8", c["name"]
        assert any("FP8_PARAM" in a or "fp8_param_gather" in a or "FP8_PARAMS" in a for a in c["assumed"]), c["name"]
    case = BY_NAME["mlperf51-uf-llama3.1-8b-b200-128gpu-fp8"]
    m, cl, wl, par, prof, _ = validation.case_inputs(case)
    assert wl.fp8_param_gather
    fp8 = estimate(m, cl, wl, par, framework=prof)
    bf16 = estimate(m, cl, dataclasses.replace(wl, fp8_param_gather=False), par, framework=prof)
    assert fp8.time["dp_comm_s"] < bf16.time["dp_comm_s"]
    assert fp8.peak_bytes < bf16.peak_bytes          # the model's weights are held in FP8


def test_zero_bubble_splits_put_one_layer_less_on_the_end_stages():
    """Qi et al.: "both the initial and final pipeline stages possess one fewer transformer layer" (the
    embedding and the loss each take a layer's slot): stages (k-1, k, ..., k, k-1) with k = (L + 2) / p."""
    zb = [c for c in MORE if c["name"].startswith("zb-")]
    assert len(zb) == 43
    for c in zb:
        L, p, st = c["model"]["layers"], c["parallel"]["pp"], c["stages"]
        k = (L + 2) // p
        assert (L + 2) % p == 0 and len(st) == p and sum(st) == L
        assert st == [k - 1] + [k] * (p - 2) + [k - 1], c["name"]
        tps = c["reported"]["tokens_per_s_per_gpu"]          # a printed samples/s (two decimals) x 1,024 tokens
        assert tps == pytest.approx(round(tps / 1024, 2) * 1024)
        # 1F1B-I: "each transformer layer serves as a chunk", the embedding and the loss in chunks of their own
        assert c["parallel"].get("virtual_stages", 1) == (k if c["name"].endswith("-1f1b-i") else 1), c["name"]


def test_zero_bubble_interleaved_rows_price_the_end_slots():
    """The 1F1B-I rows' split (k-1, k, ..., k, k-1 layers over k virtual stages each) is priced, and through
    the Megatron target (costmodel.specs.end_slots); one layer fewer on an end stage is refused, and the
    interleaved price sits between 1F1B's and 1F1B with no bubble left but the interleaved one."""
    from costmodel.specs import SpecError, stages_from_counts
    from costmodel.training import estimate
    inter = BY_NAME["zb-gpt-1.5b-a100-8gpu-pp8-mb6-m24-1f1b-i"]
    plain = BY_NAME["zb-gpt-1.5b-a100-8gpu-pp8-mb6-m24-1f1b"]
    m, cl, wl, par, prof, _ = validation.case_inputs(inter)
    assert par.vpp == 3 and validation.REFUSED.get(inter["name"]) is None
    via, stages, why = validation.target_for("megatron", m, cl, wl, par, validation.case_stages(inter))
    assert via == "megatron" and not why
    from planner.plan import targets as T
    from planner.plan.check import check_plan
    from planner.plan.planfile import Plan
    plan = Plan(model=m, cluster=cl, workload=wl, parallel=par, stages=stages, target="megatron")
    assert not [p for p in check_plan(plan) if "vpp" in p]
    # the built-in runtime cuts every virtual stage a layer (runtime/pipeline.py): refused, with why
    assert any("embedding or the loss alone" in p for p in T.problems("builtin", plan))
    e_i = estimate(m, cl, wl, par, stages=stages, framework=prof)
    m1, cl1, wl1, par1, prof1, _ = validation.case_inputs(plain)
    e_1 = estimate(m1, cl1, wl1, par1, stages=validation.case_stages(plain), framework=prof1)
    assert e_i.step_time_s < e_1.step_time_s
    # the bubble: (sum - max) / v of the same stage times, v = 3, and the interleaved fill's 40 more
    # hand-offs (stage_terms.interleaved_fill_hops), each a 6 x 1,024 x 2,304 fp16 send/recv in a
    # pipeline group of 8 on one board (comm.Network.p2p)
    from costmodel.comm import Network
    from costmodel.stage_terms import interleaved_fill_hops
    hop = Network(cl).p2p(6 * 1024 * 2304 * 2, False, 8)
    fill = e_i.time["bubble_s"] - e_1.time["bubble_s"] / 3
    assert fill == pytest.approx(interleaved_fill_hops(8, 3) * hop, rel=0.05)
    assert interleaved_fill_hops(8, 3) == pytest.approx(40.0)
    short = stages_from_counts([1, 3, 3, 3, 3, 3, 3, 3])      # the first stage two short of vpp = 3
    with pytest.raises(SpecError, match="at least vpp = 3|exceeds layers 22"):
        estimate(m, cl, wl, par, stages=short, framework=prof)
    middle = stages_from_counts([3, 3, 2, 3, 3, 3, 3, 2])     # a middle stage one short: no slot there
    with pytest.raises(SpecError, match="at least vpp = 3|exceeds layers 22"):
        estimate(m, cl, wl, par, stages=middle, framework=prof)


def test_mlperf_gpt3_rows_price_the_attention_kernel_their_te_ran():
    """MLPerf v3.0's GPT-3 runs (TE 0.8, flash-attn 1.0.5) are priced with FlashAttention 1 and v3.1's
    (TE 09ba842, flash-attn 2.0.8, flash tried before cuDNN) with FlashAttention 2, each record saying
    where its files set it; the same run priced with FA1 is slower than with FA2, slower than with
    the te default (cuDNN on Hopper)."""
    import dataclasses

    from costmodel.training import estimate
    rows = {n: c for n, c in BY_NAME.items() if n.startswith(("mlperf30-gpt3", "mlperf31-gpt3"))}
    assert len(rows) == 11
    for n, c in rows.items():
        want = "flash-attn-1" if n.startswith("mlperf30") else "flash-attn"
        assert c["profile"]["attention"] == want, n
        assert any("(stop 35)" in a and ("flash_attn==1.0.5" if want == "flash-attn-1" else "flash-attn==2.0.8") in a
                   for a in c["assumed"]), n
    m, cl, wl, par, prof, _ = validation.case_inputs(BY_NAME["mlperf30-gpt3-175b-h100-512gpu-fp8"])
    assert prof.attention == "flash-attn-1"
    steps = [estimate(m, cl, wl, par, framework=dataclasses.replace(prof, attention=a)).step_time_s
             for a in ("flash-attn-1", "flash-attn", "te")]
    assert steps[0] > steps[1] > steps[2]


def test_a_record_overrides_a_catalog_models_vocabulary():
    """Google's Mixtral 8x7B run trained the catalog's layers with the GPT-2 tokenizer: its record's
    ``vocab`` replaces the catalog's 32,000; with the router's auxiliary-loss coefficient, which the record
    also gives, nothing else of the model changes, and the larger head costs time."""
    import dataclasses

    from costmodel.catalog import get_model
    from costmodel.training import estimate
    case = next(c for c, _ in validation.all_cases() if c["name"] == "gpurec-a3ultra-mixtral-8x7b-h200-256gpu-bf16")
    m, cl, wl, par, prof, _ = validation.case_inputs(case)
    cat = get_model("mixtral-8x7b")
    assert (m.vocab, cat.vocab) == (50304, 32000)
    assert dataclasses.replace(m, vocab=cat.vocab, router_aux_coeff=cat.router_aux_coeff) == cat
    assert (estimate(m, cl, wl, par, framework=prof).step_time_s
            > estimate(dataclasses.replace(m, vocab=cat.vocab), cl, wl, par, framework=prof).step_time_s)


def test_ibm_meta_float8_post_rows_are_its_table_3_priced_as_torchtitan_ran_them():
    """IBM and Meta's float8 + FSDP2 post, Table 3 (512 H100): the four wps figures as printed, family
    ``pytorch-float8``; priced as torchtitan (compiled, SDPA attention), the float8 rows with torchao's
    tensorwise recipe and the FP8 weight all-gather, the 405B rows at TP 4 with sequence parallelism;
    the local batch unpublished (priced at 1, with its range), full recompute as torchtitan's own
    configs for these models set it."""
    from costmodel.frameworks import FRAMEWORKS
    _rows, cases = _records_and_cases("ibmfp8-", {
        "ibmfp8-llama3-70b-h100-512gpu-fsdp-bf16": 960, "ibmfp8-llama3-70b-h100-512gpu-fsdp-float8": 1448,
        "ibmfp8-llama3-405b-h100-512gpu-fsdp128-tp4-bf16": 152, "ibmfp8-llama3-405b-h100-512gpu-fsdp128-tp4-float8": 217})
    for name, c in cases.items():
        model, cluster, wl, par, prof = c.inputs
        assert c.family == "pytorch-float8" and c.framework == "torchtitan" and c.fitted_on
        # compiled: the compile factor on torchtitan's kernel efficiency (FrameworkProfile.with_switches)
        assert prof.attention == "sdpa-torchtitan" and prof.kernel_efficiency > FRAMEWORKS["torchtitan"].kernel_efficiency
        assert (par.zero, par.recompute, par.micro_batch, wl.seq_len) == (3, "full", 1, 8192)
        assert c.unpublished == ("micro-batch",) and {a for a, _ in c.alternatives} >= {"mb1 full", "mb2 full"}
        assert (par.tp, par.sp) == ((4, True) if "405b" in name else (1, False))
        if "float8" in name:
            assert (wl.dtype, wl.fp8_recipe, wl.fp8_param_gather) == ("fp8", "tensorwise", True)
        else:
            assert wl.dtype == "bf16"



# InternLM's 'FLOPS Testing' tables (InternLM/InternEvo doc/en/train_performance.md at c18bec9): GPUs, Micro Bsz,
# Micro Num -> TGS, as printed, without and with activation checkpointing
INTERNLM_NO_CKPT = {(8, 2, 4): 4103, (16, 2, 4): 3939, (32, 2, 4): 3919, (64, 2, 4): 3944, (128, 2, 4): 3928,
                    (256, 2, 4): 3920, (512, 2, 4): 3900, (1024, 2, 4): 3625, (512, 2, 2): 3084, (1024, 2, 1): 2346,
                    (1024, 2, 2): 2817}
INTERNLM_CKPT = {(8, 8, 1): 3314, (16, 8, 1): 3268, (32, 8, 1): 3323, (64, 8, 1): 3217, (128, 8, 1): 3260,
                 (256, 8, 1): 3215, (512, 8, 1): 3199, (1024, 8, 1): 3163, (512, 4, 1): 2963, (1024, 2, 1): 2341,
                 (1024, 4, 1): 2796}


def test_internlm_rows_are_its_flops_tables_priced_as_its_trainer_ran_them():
    """InternLM-7B on 8-1,024 A100 80GB (4 x 100 Gb/s RoCE per node): every row of the file's two FLOPS
    tables, family ``internlm``, each sequence 2,048 tokens with Micro Bsz of them per micro-batch and
    Micro Num micro-batches per step; TP 1, the optimizer states sharded within a node (zero 1, shard
    group 8), gradients all-reduced in bf16 in buckets of 512 Mi elements (1 GiB), parameters broadcast after the step
    without overlap, FlashAttention 1; full recompute exactly in the checkpointing table."""
    rows, cases = _records_and_cases("internlm-")
    got = {(c["num_gpus"], c["parallel"]["micro_batch"], c["global_batch"] // (c["num_gpus"] * c["parallel"]["micro_batch"]),
            c["parallel"]["recompute"]): c["reported"]["tokens_per_s_per_gpu"] for c in rows.values()}
    want = {**{k + ("none",): v for k, v in INTERNLM_NO_CKPT.items()}, **{k + ("full",): v for k, v in INTERNLM_CKPT.items()}}
    assert got == want and len(cases) == 22
    for c in cases.values():
        model, cluster, wl, par, prof = c.inputs
        assert c.family == "internlm" and c.framework == "generic" and c.fitted_on
        assert (model.layers, model.hidden, model.heads, model.ffn_hidden, model.vocab, wl.seq_len) == (
            32, 4096, 32, 11008, 103168, 2048)
        assert (par.tp, par.pp, par.zero, par.dp_shard, par.dp) == (1, 1, 1, 8, par.world_size)
        assert prof.attention == "flash-attn-1" and prof.grads_bf16 and not prof.overlap_param_gather
        assert prof.dp_bucket_params == 512 * 2**20     # elements: hybrid_zero_optim compares numel()
        # 6.25 GB/s per GPU: four 100 Gb/s links shared by a node's eight GPUs
        assert cluster.inter_node.bandwidth_bytes_per_s == pytest.approx(4 * 100e9 / 8 / 8)


def test_aws_torchtitan_rows_are_the_posts_table_priced_as_its_notebook_ran_them():
    """AWS and Meta's torchtitan post (32 H100 on 4 x p5.48xlarge): the four tokens/s per GPU as printed,
    family ``aws-torchtitan``; priced as torchtitan at FSDP over the 32 GPUs, one 8,192-token sequence per
    GPU, selective per-op checkpointing (the code sample's toml); eager for the baseline, compiled for the
    other three, float8 tensorwise for the last two and the FP8 weight all-gather for the last."""
    from costmodel.frameworks import FRAMEWORKS
    _rows, cases = _records_and_cases("awstt-", {
        "awstt-llama3-8b-h100-32gpu-bf16": 6475, "awstt-llama3-8b-h100-32gpu-bf16-compile": 7166,
        "awstt-llama3-8b-h100-32gpu-float8-compile": 8624, "awstt-llama3-8b-h100-32gpu-float8-fp8ag-compile": 8950})
    for name, c in cases.items():
        model, cluster, wl, par, prof = c.inputs
        assert c.family == "aws-torchtitan" and c.framework == "torchtitan" and c.fitted_on
        assert (par.tp, par.pp, par.dp, par.zero, par.micro_batch, par.recompute, wl.seq_len) == (
            1, 1, 32, 3, 1, "selective", 8192)
        assert prof.attention == "sdpa-torchtitan"
        compiled = prof.kernel_efficiency > FRAMEWORKS["torchtitan"].kernel_efficiency
        assert compiled == name.endswith("compile")
        if "float8" in name:
            assert (wl.dtype, wl.fp8_recipe, wl.fp8_param_gather) == ("fp8", "tensorwise", "fp8ag" in name)
        else:
            assert wl.dtype == "bf16"


# FlagPerf's Paddle LLaMA table (FlagOpen/FlagPerf training/nvidia/llama1_7B-paddle/README.md at 1b5a0303):
# (model, GPU memory, TP, PP, sharding degree, per-device batch, accumulation) -> tokens/s per GPU, as printed
FLAGPERF_PADDLE = {("llama-7b", 80, 1, 1, 8, 4, 64): 4267, ("llama-7b", 80, 2, 1, 4, 4, 128): 3888,
                   ("llama-7b", 80, 2, 1, 4, 4, 128, 2): 3650, ("llama-7b", 80, 2, 4, 1, 4, 512): 3722,
                   ("llama-7b", 40, 1, 1, 8, 2, 128): 2744, ("llama-7b", 40, 2, 1, 4, 2, 256): 2163,
                   ("llama-7b", 40, 2, 1, 4, 2, 256, 2): 2160, ("llama-7b", 40, 2, 4, 1, 2, 1024): 2232,
                   ("llama-13b", 80, 1, 1, 8, 2, 128): 1707, ("llama-13b", 80, 2, 1, 4, 2, 256): 1605,
                   ("llama-13b", 80, 2, 1, 4, 2, 256, 2): 1489, ("llama-13b", 80, 2, 4, 1, 4, 512): 1597}


def test_flagperf_rows_are_the_paddle_table_priced_as_its_configs_set_it():
    """FlagPerf's PaddlePaddle LLaMA rows on one DGX A100 (80 and 40 GB): the twelve tokens/s per GPU as
    printed, family ``flagperf``, the generic profile with none of the overlaps the configs leave off;
    Paddle's sharding stage over the data-parallel ranks (the stage-2 rows keyed apart), the pipeline rows
    without data parallelism, recomputation exactly where the config sets it, fp16. Reported on catalog
    hardware and read by no fit (``fit: false``: PaddlePaddle is neither PyTorch nor a target's stack)."""
    from costmodel import fitted
    assert not any("flagperf" in c.families for c in fitted.FITTED)
    rows, cases = _records_and_cases("flagperf-")
    assert all(c["fit"] is False for c in rows.values())
    got = {}
    for c in rows.values():
        p = c["parallel"]
        key = (c["name"].split("-")[2] + "-" + c["name"].split("-")[3], int(c["cluster"].split("-")[2].removesuffix("gb")),
               p["tp"], p["pp"], p["dp"], p["micro_batch"], c["global_batch"] // (p["dp"] * p["micro_batch"]))
        got[key + ((2,) if p["zero"] == 2 and p["tp"] > 1 else ())] = c["reported"]["tokens_per_s_per_gpu"]
    assert got == FLAGPERF_PADDLE and len(cases) == 12
    for name, c in cases.items():
        model, cluster, wl, par, prof = c.inputs
        assert c.family == "flagperf" and c.framework == "generic" and c.catalog_hardware and not c.fitted_on
        assert wl.dtype == "fp16" and wl.seq_len == 2048 and par.world_size == 8 and not par.sp
        assert not (prof.tp_comm_overlap or prof.overlap_grad_reduce or prof.overlap_param_gather)
        assert par.zero == (0 if par.dp == 1 else (2 if "sh2" in name else 1))
        assert (par.recompute == "full") == ("40gb" in name or "13b" in name)


@pytest.mark.parametrize("case", [c for c in MORE if c["name"].startswith("maxtext-llama2-7b-a3high-")],
                         ids=lambda c: c["name"])
def test_maxtext_tflops_convert_to_tokens_by_that_commits_count(case):
    """MaxText's A3 table prints TFLOP/s per chip; the record's tokens/s is that figure over MaxText's own count
    at efb6d9e4a (maxtext_utils.calculate_tflops_training_per_device): 6 x every parameter of the pytree (both
    embedding matrices, the norms) plus 12 x heads x layers x head_dim x seq / 2 per token (causal)."""
    m = validation._model(case["model"], case["name"])
    h, f, v, layers, s = m.hidden, m.ffn_hidden, m.vocab, m.layers, case["model"]["seq_len"]
    params = 2 * v * h + layers * (4 * h * h + 3 * h * f + 2 * h) + h
    assert params == 6_738_415_616                               # the Llama-2-7B pytree the commit counts
    per_token = 6 * params + 12 * m.heads * layers * m.head_dim * s / 2
    rep = case["reported"]
    assert rep["tflops_kind"] == "other"                          # converted here, not compared as a FLOP rate
    assert rep["tokens_per_s_per_gpu"] == pytest.approx(rep["tflops_per_gpu"] * 1e12 / per_token, abs=0.5)


def test_a_record_states_its_block_over_its_familys_defaults():
    """GLM-130B is recorded as the llama family's block (gated MLP, rotary positions) with LayerNorm, biases,
    dropout and tied embeddings; the keys reach the model priced (``validation.MODEL_OVERRIDES``), and the
    positions are not among them (BLOOM's ALiBi stays the gpt family's learned positions)."""
    glm = validation._model(BY_NAME["glm-130b-a100-40gb-768gpu-tp4-pp8-gbs4224"]["model"], "glm")
    assert (glm.mlp, glm.positions, glm.norm, glm.bias, glm.dropout, glm.tied_embeddings) == \
        ("swiglu", "rotary", "layernorm", True, True, True)
    plain = validation._model({k: v for k, v in BY_NAME["glm-130b-a100-40gb-768gpu-tp4-pp8-gbs4224"]["model"].items()
                               if k not in validation.MODEL_OVERRIDES}, "plain")
    assert (plain.norm, plain.bias, plain.dropout, plain.tied_embeddings) == ("rmsnorm", False, False, False)
    assert "positions" not in validation.MODEL_OVERRIDES
    bloom = next(c for c, _s in validation.all_cases() if c["model"].get("positions") == "alibi")
    assert validation._model(bloom["model"], "bloom").positions == "learned"


# Fujii's sweep (okoge-kaz/Megatron-LM at e4e8c218, scripts/abci/Llama-3.1-8B/4d_parallelism.md): the A100
# table's measured cells per (TP, CP, PP, micro-batch) row, by GPU count, as the file prints them
FUJII_A100 = {
    (4, 1, 2, 1): {8: 182.6, 16: 178.38, 32: 176.79, 64: 170.84, 128: 169.52, 256: 153.9},
    (4, 1, 2, 2): {16: 189.79, 32: 187.01, 64: 185.69, 128: 182.28, 256: 178.62},
    (4, 2, 2, 1): {16: 151.65, 32: 148.7, 64: 142.34, 128: 134.34, 256: 116.28},
    (4, 2, 2, 2): {16: 155.01, 32: 160.27, 64: 158.15, 128: 150.64, 256: 127.03},
    (2, 2, 2, 1): {16: 192.62, 32: 185.07, 64: 178.58, 128: 165.2, 256: 142.61},
    (2, 4, 2, 1): {16: 155.35, 32: 139.46, 64: 124.56, 128: 108.73, 256: 98.79},
    (2, 4, 2, 2): {32: 140.68, 64: 138.89, 128: 124.05, 256: 117.65},
    (4, 2, 1, 1): {16: 174.07, 32: 171.99, 64: 168.66, 128: 162.15, 256: 153.03},
    (4, 2, 1, 2): {16: 188.97, 32: 187.29, 64: 185.35, 128: 183.49, 256: 181.97},
    (2, 2, 4, 1): {16: 153.99, 32: 137.78, 64: 133.72, 128: 121.44},
    (2, 2, 4, 2): {32: 143.15, 64: 135.33, 128: 126.91},
    (2, 4, 1, 1): {32: 163.1, 64: 153.42, 128: 144.44, 256: 131.53},
}


def _fujii_flops_per_token(s: int) -> float:
    """The fork's ``num_floating_point_operations`` per token for Llama-3.1-8B at sequence ``s``: 12 l h^2
    [(1 + g/a + s/h) + 1.5 ffn/h + V/(2 l h)] (full s x s attention, SwiGLU's 3/2, the output layer only)."""
    h, f, L, a, g, v = 4096, 14336, 32, 32, 8, 128256
    return 12 * L * h * h * ((1 + g / a + s / h) + 1.5 * f / h + v / (2 * L * h))


def test_fujii_rows_are_the_a100_table_converted_by_the_forks_count():
    """Fujii's A100 sweep: every measured cell once, as printed (TFLOP/s per GPU, ``tflops_kind: other``: not
    compared as a rate); tokens/s per GPU is that over the fork's ``num_floating_point_operations`` per token for
    Llama-3.1-8B at 8,192 (full s x s attention, SwiGLU's 3/2, the output layer only); DP = GPUs / (TP x CP x PP),
    the script's global batch 1,024, no recompute, sequence parallel, the script's overlaps (TP's off); on the ABCI
    cluster file; family fujii-4d, read by no fit."""
    from costmodel import fitted
    assert not any("fujii-4d" in c.families for c in fitted.FITTED)
    rows, cases = _records_and_cases("fujii4d-llama3.1-8b-a100-")
    per_token = _fujii_flops_per_token(8192)
    assert per_token == 57_912_852_480
    got = {}
    for c in rows.values():
        p, rep = c["parallel"], c["reported"]
        assert c["fit"] is False and c["global_batch"] == 1024 and c["framework"] == "megatron"
        assert p["dp"] * p["tp"] * p["cp"] * p["pp"] == c["num_gpus"] and p["recompute"] == "none" and p["sp"]
        assert rep["tflops_kind"] == "other"
        assert rep["tokens_per_s_per_gpu"] == pytest.approx(rep["tflops_per_gpu"] * 1e12 / per_token, abs=0.05)
        got.setdefault((p["tp"], p["cp"], p["pp"], p["micro_batch"]), {})[c["num_gpus"]] = rep["tflops_per_gpu"]
    assert got == FUJII_A100 and len(rows) == 56
    for c in cases.values():
        model, cluster, wl, par, prof = c.inputs
        assert c.family == "fujii-4d" and c.catalog_hardware and not c.fitted_on
        assert cluster.inter_node.bandwidth_bytes_per_s == 12.5e9 and cluster.groups[0].gpu.name == "A100-SXM4-40GB"
        assert model.kv_heads == 8 and not model.tied_embeddings and wl.seq_len == 8192
        assert prof.overlap_grad_reduce and prof.overlap_param_gather and not prof.tp_comm_overlap
        assert not prof.grads_bf16


def test_fujii_h100_rows_are_the_tables_converted_and_reported_apart():
    """Fujii's H100 tables (TSUBAME 4.0): every measured cell of both sequence lengths once, but the eight whose
    value appears twice in the same table (four pairs, dropped by the rule written before pricing); tokens/s per
    GPU over the fork's count at that sequence; on the TSUBAME cluster file (4 GPUs per node, HBM2e at 2.4 TB/s,
    the NVLink mesh, 4 x NDR200); flash-attn, as TE 1.9 ran under PyTorch 2.3's cuDNN; reported apart from the
    headline (other hardware) and read by no fit."""
    import collections

    rows, cases = _records_and_cases("fujii4d-llama3.1-8b-h100-94gb-")
    assert len(rows) == 104
    per_token = _fujii_flops_per_token
    assert (per_token(8192), per_token(16384)) == (57_912_852_480, 70_797_754_368)
    # cells as the file prints them (4d_parallelism.md lines 50, 61, 77 and 105: the first cell of each table, the
    # 128-GPU TP 4 mb 4 cell and the last one; TP 4 CP 2 mb 2 at 32 GPUs is one of the dropped copies, 299.95)
    for name, cell in (("4gpu-seq8192-tp2-cp1-pp1-mb1", 446.72), ("128gpu-seq8192-tp4-cp1-pp1-mb4", 438.55),
                       ("8gpu-seq16384-tp2-cp1-pp1-mb1", 497.56), ("32gpu-seq16384-tp4-cp2-pp1-mb2", None),
                       ("8gpu-seq16384-tp4-cp2-pp1-mb2", 297.73)):
        rec = rows.get(f"fujii4d-llama3.1-8b-h100-94gb-{name}")
        assert (rec["reported"]["tflops_per_gpu"] if rec else None) == cell, name
    cells = collections.Counter()
    for c in rows.values():
        p, rep, s = c["parallel"], c["reported"], c["model"]["seq_len"]
        assert c["fit"] is False and c["global_batch"] == 1024 and c["framework"] == "megatron"
        assert p["dp"] * p["tp"] * p["cp"] * p["pp"] == c["num_gpus"] and p["recompute"] == "none"
        assert rep["tokens_per_s_per_gpu"] == pytest.approx(rep["tflops_per_gpu"] * 1e12 / per_token(s), abs=0.05)
        assert c["profile"]["attention"] == "flash-attn" and not validation.hardware_matches(c)
        cells[(s, rep["tflops_per_gpu"])] += 1
    assert max(cells.values()) == 1
    for dup in (365.75, 436.77, 295.71, 299.95):
        assert (16384, dup) not in cells
    for c in cases.values():
        model, cluster, wl, par, prof = c.inputs
        assert c.family == "fujii-4d" and not c.catalog_hardware and not c.fitted_on
        g = cluster.groups[0]
        assert g.gpus_per_node == 4 and g.gpu.hbm_bandwidth_bytes_per_s == 2396e9 and g.intra_node.mesh_peers == 3
        assert cluster.inter_node.bandwidth_bytes_per_s == 25e9


def test_thunder_rows_are_the_prs_tables_priced_as_the_benchmark_ran_them():
    """Lightning-Thunder's litgpt benchmark rows (PRs #940, #997, #1528): the five tokens/s per GPU as printed, family
    lightning-thunder; PyTorch FSDP2 (its copies) with reshard_after_forward False (ZeRO-2), gradients reduced in bf16,
    FlashAttention-2, compiled where the row says torch.compile; one micro-batch per step (global batch = micro-batch
    x 8), no recompute; float8 rows tensorwise with the weights all-gathered in float8. PyTorch-native on H100: read by
    the sm_90 factor's fit (and the float8 rows by the FP8 fit)."""
    from costmodel import fitted
    rows, cases = _records_and_cases("thunder-", {
        "thunder-llama2-7b-h100-8gpu-fsdp2-zero2-compile-bf16": 11855.92,
        "thunder-llama2-7b-h100-8gpu-fsdp2-zero2-eager-bf16": 9325.13,
        "thunder-llama2-7b-h100-8gpu-fsdp2-zero2-compile-float8-mb1": 14640.35,
        "thunder-llama2-7b-h100-8gpu-fsdp2-zero2-compile-float8-mb2": 17993.14,
        "thunder-llama3-8b-h100-8gpu-fsdp2-zero2-compile-float8": 12404.18})
    assert "lightning-thunder" in fitted.BY_NAME["pytorch.sm90_factor"].families
    assert "lightning-thunder" in fitted.FP8_FAMILIES
    for name, c in cases.items():
        model, cluster, wl, par, prof = c.inputs
        rec = rows[name]
        assert c.family == "lightning-thunder" and c.framework == "generic" and c.catalog_hardware and c.fitted_on
        assert prof.pytorch_native and prof.fsdp2_copies and prof.grads_bf16 and prof.attention == "flash-attn"
        assert par.zero == 2 and par.dp == 8 and par.recompute == "none"
        assert rec["global_batch"] == 8 * par.micro_batch and par.micro_batch == (2 if name.endswith("mb2") else 1)
        assert ("compile" in name) == ("+compile" in prof.name), prof.name
        assert wl.seq_len == (8192 if "llama3" in name else 4096)
        if "float8" in name:
            assert wl.dtype == "fp8" and rec["fp8_recipe"] == "tensorwise" and rec["fp8_param_gather"] is True
        else:
            assert wl.dtype == "bf16"


def test_pai_megatron_rows_are_the_pages_tables_and_their_split():
    """XTuner's Megatron MoE benchmark (Qwen3-235B-A22B on 256 H800) and the same author's Pai-Megatron-Patch
    issue #643 (Qwen3-30B-A3B on 16 H800): every row's step time, global batch, sequence and GPU count give the
    page's Tokens/GPU/Second (quoted in its note) to the printed precision; the 235B rows put one layer less on
    the first and last pipeline stages (94 layers over 96 slots), the family is their own, and the rows the
    page names recompute modules for are priced with exactly those modules."""
    import re
    cases = [c for c in yaml.safe_load(validation.MOE_RUNS.read_text())["cases"]
             if c["name"].startswith(("xtuner-", "pai643-"))]
    assert len(cases) == 12
    for c in cases:
        tgs = float(re.search(r"Tokens/GPU/Second ([\d.]+)", c["note"]).group(1))
        step = c["reported"]["step_time_s"]
        assert c["global_batch"] * c["model"]["seq_len"] / (step * c["num_gpus"]) == pytest.approx(tgs, abs=1.0), c["name"]
        par = c["parallel"]
        assert par["dp"] * par["tp"] * par["pp"] == c["num_gpus"]
        assert family_of(c["source"]) == "pai-megatron"
        if c["name"].startswith("xtuner-"):
            per = 96 // par["pp"]
            assert c["stages"] == [per - 1] + [per] * (par["pp"] - 2) + [per - 1]
            mods = {"select": ["moe_act", "layernorm"], "moe": ["moe", "layernorm"]}
            kind = next((k for k in mods if c["name"].endswith(k)), None)
            assert par.get("recompute_modules") == mods.get(kind), c["name"]


def test_kempnerforge_rows_are_the_reports_whole_job_rates_per_gpu():
    """KempnerForge's reports print the whole job's tokens/s: each row's global batch x 4,096 over its
    printed step time is that rate (to the step's two decimals), and the record's per-GPU figure is it
    over the GPU count; the layouts fill the GPUs (TP x FSDP), on the 4-GPU-node cluster file."""
    import re
    rows = [c for c in MORE if c["name"].startswith("kforge-")]
    assert len(rows) == 26
    for c in rows:
        agg, step = re.search(r"tok/s ([\d,]+) is the whole job's .* / ([\d.]+) s", c["note"]).groups()
        agg, step = float(agg.replace(",", "")), float(step)
        tokens = c["global_batch"] * c["model"]["seq_len"]
        assert tokens / step == pytest.approx(agg, rel=0.01 / step + 2e-3), c["name"]
        assert c["reported"]["tokens_per_s_per_gpu"] == pytest.approx(agg / c["num_gpus"], abs=0.01)
        par = c["parallel"]
        assert par["tp"] * par["dp"] == c["num_gpus"] and c["cluster"].endswith("kempner-h200-4gpu-ndr.yaml")
        assert family_of(c["source"]) == "kempnerforge"


def test_torchtitan_nvfp4_page_rows_are_its_table_on_one_gb200_tray():
    """torchtitan's NVFP4 page (stop 53): its BF16 and MXFP8 Llama 3 8B rows as the table prints them; the
    layout is the page's command (FSDP 4, local batch 32 of 2,048 tokens, global 128); the GPU is read
    from the memory column: each row's GiB over its percent is one device of about 184.3 GiB, a GB200's
    (185.0 GiB by nvidia-smi) and not a B200's (179.1 GiB)."""
    cases = yaml.safe_load(validation.FRAMEWORK_RUNS.read_text())["cases"]
    rows = {c["name"]: c for c in cases if c["name"].startswith("tt2608-")}
    table = {"bf16": (21919, 174.49, 0.947), "mxfp8": (28084, 179.94, 0.976)}
    assert len(rows) == len(table)
    for kind, (tps, gib, share) in table.items():
        c = next(c for n, c in rows.items() if f"-{kind}-" in n)
        assert c["reported"] == {"tokens_per_s_per_gpu": tps, "peak_memory_gib": gib}
        device = gib / share
        assert abs(device - 185.0) < 1.0 < abs(device - 179.1), c["name"]
        assert c["cluster"] == "gb200-nvl72" and c["num_gpus"] == 4
        par = c["parallel"]
        assert par["dp"] == 4 and par["micro_batch"] == 32 and c["global_batch"] == 128 == 4 * 32
        assert c["model"]["seq_len"] == 2048 and (c.get("fp8_recipe") == "mxfp8") == (kind == "mxfp8")
        assert family_of(c["source"]) == "torchtitan"


def test_zoo_pp32_row_is_the_readme_row_it_quotes():
    """The ModelZoo's alltoall row at PP32/VPP3 (stop 53): every layout number and the step time and TFLOP/s are
    those of the README row its source quotes ('Model | Dispatcher | System | Precision | #GPUs | SEQ LEN | TP | CP |
    EP | PP | EDP | ETP | VPP | DP | FSDP | MBS | GBS | GA | recompute | Step time | Per GPU TF'), and the stage split
    puts 94 layers in PP32 x VPP3 with the embedding and the loss counted (96 slots)."""
    import re
    cases = yaml.safe_load((ROOT / "calibration" / "published_runs_moe.yaml").read_text())["cases"]
    c = next(c for c in cases if c["name"] == "zoo-qwen3-235b-h100-256gpu-tp2-ep8-pp32-vpp3-a2a")
    row = re.search(r"row '(235B \| A2A[^']*)'", " ".join(c["source"].split())).group(1)
    cells = [x.strip() for x in row.split("|")]
    gpus, seq, tp, cp, ep, pp, edp, etp, vpp, dp = (int(x) for x in cells[4:14])
    mbs, gbs, ga = int(cells[15]), int(cells[16]), int(cells[17])
    step, tf = float(cells[19]), float(cells[20])
    par = c["parallel"]
    assert (gpus, seq) == (c["num_gpus"], c["model"]["seq_len"]) and cp == 1
    assert (tp, ep, pp, etp, vpp, dp) == (par["tp"], par["ep"], par["pp"], par["etp"], par["vpp"], par["dp"])
    assert tp * pp * dp == gpus and edp == gpus // (etp * ep * pp)
    assert (mbs, gbs) == (par["micro_batch"], c["global_batch"]) and ga == gbs // (dp * mbs)
    assert c["reported"] == {"step_time_s": step, "tflops_per_gpu": tf, "tflops_kind": "model-causal"}
    assert c["stages"] == [2] + [3] * 30 + [2] and sum(c["stages"]) + 2 == pp * vpp == 96
    assert c["moe"]["dispatcher"] == "alltoall" and cells[1] == "A2A"
