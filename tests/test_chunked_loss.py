"""torchtitan's chunked loss as its file writes it (stop 53): ``ChunkedLossWrapper`` (8 chunks by
default) runs the output head and cross-entropy one chunk of the tokens at a time, each chunk's backward
before the next, so one chunk's logits are held (``FrameworkProfile.loss_chunks``, ``layers.ends_cost``);
its FSDP2 post-backward hook reduce-scatters the head's gradient after every chunk
(``StageModel._chunked_head_rs``). Memory by hand from Llama 3.1 8B's vocabulary."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import FRAMEWORKS
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate

V = 128256


def _pair(par: ParallelConfig, gpus: int, seq: int = 8192):
    model = get_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100").with_gpus(gpus)
    wl = Workload(global_batch=par.dp * par.micro_batch * par.grad_accum, seq_len=seq)
    on = FRAMEWORKS["torchtitan"]
    assert on.loss_chunks == 8            # ChunkedLossWrapper.Config's default, which the emitter leaves
    off = dataclasses.replace(on, loss_chunks=1)
    return estimate(model, cluster, wl, par, framework=on), estimate(model, cluster, wl, par, framework=off)


def test_one_chunk_of_logits_is_held():
    par = ParallelConfig(dp=8, zero=3, micro_batch=2, grad_accum=1, recompute="full")
    on, off = _pair(par, 8)
    tokens = 2 * 8192
    logits = tokens * V * (2 + 4)           # bf16 logits and their fp32 copy
    assert off.peak_bytes - on.peak_bytes == pytest.approx(logits * 7 / 8, rel=1e-9)


def test_the_heads_gradient_is_reduced_after_every_chunk_where_fsdp_shards_it():
    sharded = ParallelConfig(dp=64, zero=3, micro_batch=1, grad_accum=2, recompute="selective")
    on, off = _pair(sharded, 64)
    head_rs = 7 * V * 4096 * 4              # seven more reduce-scatters of the fp32 head gradient
    # slower, and by less than those bytes would take unoverlapped on the 64 GPUs' ring across 8 nodes (one 400 Gb/s
    # NIC a GPU at 0.9 of line rate: the catalog dgx-h100's inter-node link): FSDP overlaps them with the backward
    assert 0 < on.step_time_s - off.step_time_s < head_rs / (50e9 * 0.9)
    replicated = ParallelConfig(dp=8, zero=1, micro_batch=1, grad_accum=2, recompute="selective")
    on, off = _pair(replicated, 8)
    assert on.step_time_s == off.step_time_s          # nothing sharded: no extra reduce-scatter priced
