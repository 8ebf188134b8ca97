"""FSDP2's copies on the compute stream: the bytes PyTorch's per-parameter FSDP (``fully_shard``)
moves through HBM on the stream the layers run on, per gathered block and per micro-batch, beside
the NCCL collectives the cost model prices as communication (``stage_terms.StageModel.states_part``).

Source: pytorch/pytorch at 010ae4a89516fa3be548ab16dff711414ec12d0b,
``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``:

* ``foreach_all_gather_copy_out``: after ``device_handle.current_stream().wait_event(all_gather_event)``
  it runs ``torch.ops.fsdp.split_with_sizes_copy(all_gather_output, all_gather_input_split_sizes,
  dim=1, out=out)``: every gathered value is read from the collective's flat output and written into
  its own parameter's unsharded tensor, on the current (compute) stream. FSDP1 gathers its flat
  parameter in place (its parameters are views of the flat buffer), so it has no such copy (FSDP1's
  design; its source was not read at a commit for this rule, which leaves FSDP1 unpriced).
* ``foreach_reduce``: ``foreach_reduce_scatter_copy_in(unsharded_grads, reduce_scatter_input,
  world_size)`` (``torch.ops.fsdp.chunk_cat``, which "handles widening casts (e.g. bf16 -> fp32)
  natively") runs before ``reduce_scatter_stream.wait_stream(current_stream)`` and outside the
  ``reduce_scatter_stream`` context, i.e. on the compute stream: every unsharded gradient value is
  read in its compute dtype and written once in the reduce dtype (``MixedPrecisionPolicy.reduce_dtype``).

Under ZeRO-2 (``reshard_after_forward=False``: the emitters' and the runtime's ZeRO-2) a block is
gathered once per micro-batch: ``FSDPModule.set_reshard_after_backward`` (default True) reshards it
after backward, "since the unsharded parameters do not need to be re-all-gathered before the next
forward" only when turned off (PyTorch docs, ``torch.distributed.fsdp.fully_shard``,
``FSDPModule.set_reshard_after_backward``: "This can be used during gradient accumulation to trade off
higher memory for reduced communication"); ``runtime/parallel.py`` never turns it off, nor does
torchtitan at b5bcd76c66 for its blocks (only ``components/loss.py`` toggles it on the output head), nor
Accelerate at 16cb6eb80d (its ``no_sync`` for FSDP2 only calls ``set_requires_gradient_sync(False)``,
which skips the reduce-scatter on all but the last micro-batch: not priced here, the model reduce-scatters
every micro-batch). So FSDP2's ZeRO-2 all-gathers the weights before each micro-batch's forward
(``stage_terms.StageModel.states_part`` prices that gather per micro-batch for FSDP2 profiles, where
Megatron's and DeepSpeed's ZeRO-2 gather once per step after the optimizer).

With ``reshard_after_forward=True`` (``fully_shard``'s default; torchtitan's and OLMo-core's per-block
setting under ZeRO-3) a block is gathered twice per micro-batch, before its forward and before its
backward, and its gradients are reduce-scattered once per micro-batch unless the trainer turns
gradient sync off (OLMo-core at e27ba74550 does so only for DDP: ``src/olmo_core/train/trainer.py``
``_train_microbatch_context``). Per parameter and micro-batch the compute stream therefore moves
``gathers x 2 x gather_bytes + grad_bytes + reduce_bytes`` bytes.

What is not priced here: the all-gather copy-in (``foreach_all_gather``: the local shard cast to the
parameter dtype and copied into the send buffer) and the post-reduce accumulation into the sharded
gradient run on FSDP's own streams over 1/N of the values, beside the compute, so they cost only the
HBM bandwidth they share (not priced, as no other overlapped stream's share is); FSDP1's and
DeepSpeed ZeRO-3's own copies (FSDP1 gathers in place; its reduce dtype cast is not read here).
"""
from __future__ import annotations

# gathers of each block per micro-batch under ZeRO-3 (reshard_after_forward=True): forward and backward
FSDP2_GATHERS_PER_MICROBATCH = 2


def fsdp2_copy_bytes(params: float, gather_bytes: float, grad_bytes: float, reduce_bytes: float,
                     gathers: int = FSDP2_GATHERS_PER_MICROBATCH) -> float:
    """HBM bytes FSDP2 moves on the compute stream per micro-batch for ``params`` unsharded
    parameters (module docstring): each of ``gathers`` all-gathers' copy-out reads and writes every
    value (``gather_bytes`` each, the all-gather's dtype), and the reduce-scatter's copy-in reads each
    gradient in its compute dtype (``grad_bytes``) and writes it in the reduce dtype
    (``reduce_bytes``)."""
    if params <= 0:
        return 0.0
    return params * (gathers * 2.0 * gather_bytes + grad_bytes + reduce_bytes)
