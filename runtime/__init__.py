"""The runtime: runs a plan file with torch.distributed, measures it, checkpoints, resumes.

It reads only the plan (``planner.plan.planfile``) and the spec types in it (``costmodel.specs``).

* ``runtime.train``      -- the entry point ``python -m runtime.train --plan PLAN ...`` (torchrun
                            or one process): set-up, training loop, metrics, summary;
* ``runtime.model``      -- the Llama / GPT / MoE decoder built from a ``ModelSpec``, and its
                            deterministic, split-independent initialisation;
* ``runtime.parallel``   -- the mesh in the plan's order and the ordered parallel pass (TP/SP,
                            experts, activation checkpointing, FSDP2/HSDP/DDP);
* ``runtime.pipeline``   -- virtual stages and the pipeline schedules;
* ``runtime.data``       -- the token stream, a function of the workload alone;
* ``runtime.checkpoint`` -- atomic DCP checkpoints that load under any plan;
* ``runtime.dryrun``     -- every rank's shards on the meta device under the fake backend;
* ``runtime.local``      -- a pool of local worker processes (tests, demos) and ``make_plan``;
* ``runtime.errors``     -- the error types a user can cause (exit 2).
"""
