"""cp5's table: the attention time the estimate would need for each torchtitan 8B CP row to match
its published tokens/s (the whole gap charged to attention). Run from the worktree root:
.venv/bin/python docs/notes/stop-23/cp5_attention_needed.py"""
import costmodel.layers as layers
from costmodel import training
from planner.cli import validation as V
from planner.plan import targets as T

PUBLISHED = {  # tokens/s per GPU, torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 2
    "tt2412-llama3.1-8b-h100-8gpu-fsdp8-cp1-seq32768": 3890,
    "tt2412-llama3.1-8b-h100-8gpu-fsdp4-cp2-seq65536": 2540,
    "tt2412-llama3.1-8b-h100-8gpu-fsdp2-cp4-seq131072": 1071,
    "tt2412-llama3.1-8b-h100-8gpu-fsdp1-cp8-seq262144": 548,
}


def main() -> None:
    for case, _split in V.all_cases():
        name = case["name"]
        if name not in PUBLISHED:
            continue
        model, cluster, wl, par, prof, fw = V.case_inputs(case)
        via, stages, _why = V.target_for(fw, model, cluster, wl, par, V.case_stages(case))
        rec = T.record(via)
        runs = rec.table.for_config(par).runs
        prof = V._with_overrides(prof, V.FRAMEWORKS.get(runs, V.FRAMEWORKS[rec.profile]))
        est = training.estimate(model, cluster, wl, par, stages=stages, framework=prof)
        lc = layers.layer_cost(model, False, wl, par.tp, par.cp, 1, par.sp, par.micro_batch, cluster.gpu, cluster,
                               cluster.groups[0].intra_node, *_layouts(par, cluster), attention=prof.attention,
                               kernel_efficiency=prof.kernel_efficiency, elementwise=prof.elementwise,
                               launch=prof.launch)
        published_step = est.step_time_s * est.tokens_per_s_per_gpu / PUBLISHED[name]
        # forward, recompute forward, backward (twice the forward plus the kernel's extra)
        attention = model.layers * (4 * lc.attn_fwd_s + lc.attn_bwd_extra_s)
        need = 1 + (published_step - est.step_time_s) / attention
        print(f"{name:52s} predicted {est.step_time_s:6.2f} s  published {published_step:6.2f} s  "
              f"attention {attention:6.2f} s  needed x{need:.2f}")


def _layouts(par, cluster):
    from costmodel.comm import group_layout
    sizes = {"tp": par.tp, "cp": par.cp, "dp": par.dp, "pp": par.pp}
    order = ("tp", "cp", "dp", "pp")
    per_node = cluster.gpus_per_node
    tp = group_layout(sizes, order, "tp", per_node)
    return tp, tp, group_layout(sizes, order, "cp", per_node)


if __name__ == "__main__":
    main()
