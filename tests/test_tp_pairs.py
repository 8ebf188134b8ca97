"""TP overlap collective by collective (costmodel.layers._tp_blocks, costmodel.stage_terms.paired_tp_s).

A TP overlap (Transformer Engine's userbuffers, PyTorch's async TP) runs each collective beside the one
GEMM that consumes or produces it, so what it hides is priced pair by pair. These tests hold the blocks
against the layer's matrices, priced one by one with the same GEMM rule, and the exposed time against
the aggregate rule it replaced, which it can never undercut."""
from __future__ import annotations

import pytest

from costmodel.catalog import get_model
from costmodel.comm import GroupLayout
from costmodel.compute import gemm_time_s
from costmodel.files.clusters import load_cluster
from costmodel.layers import layer_cost
from costmodel.matrices import layer_matrices
from costmodel.specs import Workload
from costmodel.stage_terms import layer_terms, overlapped, paired_tp_s

ONE = GroupLayout(1, 1)


def _lc(model: str, tp: int, sp: bool = True, moe: bool = False, seq: int = 8192, mb: int = 1):
    cl = load_cluster("dgx-h100")
    return cl, layer_cost(get_model(model), moe, Workload(global_batch=8, seq_len=seq), tp, 1, 1, sp, mb,
                          cl.gpu, cl, cl.intra_node, GroupLayout(tp, min(tp, 8)), ONE, ONE)


@pytest.mark.parametrize("sp", [True, False])
def test_blocks_hold_every_collective_and_every_dense_gemm(sp):
    """The blocks' collectives are the layer's TP traffic, and their GEMMs the layer's GEMMs, each
    matrix priced on its own with the rule ``gemm_fwd_s`` sums (a dense layer: every matrix is in a
    block)."""
    cl, lc = _lc("llama-3-8b", 8, sp)
    assert len(lc.tp_blocks) == 2
    assert sum(b[0] + b[2] for b in lc.tp_blocks) == pytest.approx(lc.tp_fwd_s, rel=1e-12)
    assert sum(b[1] + b[3] for b in lc.tp_blocks) == pytest.approx(lc.gemm_fwd_s, rel=1e-9)
    model = get_model("llama-3-8b")
    T = 8192
    by_name = {mx.name: gemm_time_s(cl.gpu, cl, "bf16", T, mx.n, mx.k, mx.count, train=True)
               for mx in layer_matrices(model, False, 8)}
    (_, attn_col, _, attn_row), (_, mlp_col, _, mlp_row) = lc.tp_blocks
    assert attn_col == pytest.approx(by_name["qkv"])
    assert attn_row == pytest.approx(by_name["attn_out"])
    assert mlp_col == pytest.approx(by_name["mlp_in"])
    assert mlp_row == pytest.approx(by_name["mlp_out"])
    if not sp:
        assert all(b[0] == 0.0 for b in lc.tp_blocks)      # one all-reduce a block, on the row side


def test_grouped_query_attention_leaves_the_qkv_gather_exposed():
    """Llama 3 8B at TP 8: the QKV GEMM is 768 wide on a rank (32 query heads' 4,096 and 8 KV heads'
    2,048 over 8), so its all-gather of the whole hidden width outlasts it; the MLP's first GEMM (7,168
    wide) hides its gather. Paired, the layer exposes more than the aggregate rule, which let the MLP's
    GEMMs hide the attention's gather."""
    cl, lc = _lc("llama-3-8b", 8)
    s = cl.compute_comm_slowdown
    (ag, qkv, rs, out), (ag2, mlp_in, rs2, mlp_out) = lc.tp_blocks
    assert ag > qkv and ag2 < mlp_in
    fwd, _ = paired_tp_s(lc.tp_blocks, "full", True, s)
    assert fwd == pytest.approx(overlapped(ag, qkv, s) + overlapped(rs, out, s)
                                + overlapped(ag2, mlp_in, s) + overlapped(rs2, mlp_out, s))
    assert fwd > overlapped(lc.tp_fwd_s, lc.gemm_fwd_s, s) + 1e-6


@pytest.mark.parametrize("mode", ["full", "async_tp", "backward", "none"])
def test_paired_never_hides_more_than_the_aggregate(mode):
    """Pairing can only expose more: hiding a collective behind its own GEMM is a special case of
    hiding all the collectives behind all the GEMMs (``overlapped`` is convex in what it hides). The
    forward is held against the aggregate rule it replaced, and so is the backward where that rule
    gave it the same window (``full``); every mode exposes at most all of it, and ``layer_terms``
    prices exactly the pairs (with the expert-TP gather, which no overlap covers)."""
    for model, tp, sp, moe in (("llama-3-8b", 2, True, False), ("llama-3-70b", 8, True, False),
                               ("llama-3-70b", 4, False, False), ("mixtral-8x7b", 4, True, True)):
        cl, lc = _lc(model, tp, sp, moe)
        s = cl.compute_comm_slowdown
        fwd, bwd = paired_tp_s(lc.tp_blocks, mode, sp, s)
        hidden = mode in ("full", "async_tp")
        agg_fwd = overlapped(lc.tp_fwd_s, lc.gemm_fwd_s, s) if hidden else lc.tp_fwd_s
        assert fwd >= agg_fwd - 1e-12, (model, tp, sp, mode)
        if mode == "full":
            assert bwd >= agg_fwd - 1e-12, (model, tp, sp)
        if mode == "none":
            assert bwd == pytest.approx(lc.tp_fwd_s)
        assert fwd + bwd <= 2 * lc.tp_fwd_s + 1e-12
        assert layer_terms(lc, s, mode, sp=sp).tp_comm_s == pytest.approx(fwd + bwd + 2 * lc.etp_fwd_s)


def test_moe_attention_collectives_see_only_the_attention_gemms():
    """An MoE layer without shared experts has one TP block, the attention's: its gather and scatter
    run beside QKV and the output projection, never beside the experts' GEMMs (which the aggregate
    rule let hide them)."""
    cl, lc = _lc("mixtral-8x7b", 4, moe=True)
    assert len(lc.tp_blocks) == 1
    (ag, col, rs, row), = lc.tp_blocks
    assert col + row < lc.gemm_fwd_s / 2                  # the experts' GEMMs are the most of the layer's
    s = cl.compute_comm_slowdown
    fwd, bwd = paired_tp_s(lc.tp_blocks, "full", True, s)
    assert fwd == pytest.approx(overlapped(ag, col, s) + overlapped(rs, row, s))
    assert fwd + bwd > 2 * overlapped(lc.tp_fwd_s, lc.gemm_fwd_s, s)


def test_no_tp_no_blocks():
    cl, lc = _lc("llama-3-8b", 1)
    assert lc.tp_blocks == () and lc.tp_fwd_s == 0.0
    assert paired_tp_s((), "full", True, cl.compute_comm_slowdown) == (0.0, 0.0)
