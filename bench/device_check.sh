#!/usr/bin/env bash
# The one prepared GPU check (issues 4, 5, 7, 23): for a session whose task is lent a GPU machine
# (the device tool's `status`).
#
# Prepare here (the device machine reaches nothing; its python3 3.12 holds torch, pandas, pyyaml,
# rich, nvidia-ml-py and pytest, but not OR-Tools):
#   echo /.whl/ >> .git/info/exclude
#   V=$(.venv/bin/python -m pip show ortools | awk '/^Version/{print $2}')
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl "ortools==$V" immutabledict "protobuf>=6.33.1,<6.34"
# (about 30 MiB; the tree that travels is limited to 64 MiB). Then one call:
#   run(command="bash bench/device_check.sh", carry=[".whl"], timeout_s=590)
# (the steps' own limits add to about 570 s: PROFILE_S, CURVES_S, STEP_S, TESTS_S and 60 s for the launch;
# the first run, session 31, took 209 s)
# and give_back. What comes back under $OUT: the GPU, the measured profile (cluster.yaml and its
# summary: GEMMs by shape, HBM, and fused attention by kernel, head dim, sequence, mask and
# direction -- the H200's measured curves issue 23 asks for, gpu.attention_table), the component
# figures the profile does not take (bench/device_curves.py: memory-bound kernels eager and
# compiled, FP8 GEMMs with and without casts, the launch floor eager and under CUDA graphs, each
# beside the cost model's assumption), the GPU tests' output (1B model on one GPU: peak memory, step time and MFU against
# predicted; serving on the GPU; the quick profile against the datasheet) and a launch of a
# planned 1B plan with its predicted-vs-measured table (eight files at most come back: the logs and
# the profile's raw rows as logs.tgz). Copy the figures into the README.
#
# Session 31 ran it once (209 s; results in bench/results/device-h200, docs/notes/stop-31). What it did
# not measure and a next lent GPU could: Transformer Engine's layers and FP8 recipes (TE is not in the
# device image: carry its wheel), attention at head dim 256 and 32k tokens, the compiled runtime's
# kernel count under FSDP2's mixed precision (the per-block compile measured here ran under autocast's
# casts), anything of more than one GPU, and the profile's small GEMMs timed as CUDA-graph replays
# (profiles.bench_matmul.time_graphed, added after the device time was spent: its 1,024-cube point was
# 0.14 of peak, the host's launch rate, not the GPU's).
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-check-out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{ python3 -c "import ortools, torch; print('ortools', ortools.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  nvidia-smi; } > "$OUT/env.txt" 2>&1
LOGS=/tmp/device-check-logs
mkdir -p "$LOGS"

# 1. the full profile of this GPU (matmul by dtype and shape, HBM copy, fused attention by SDPA
#    kernel; overlap; one GPU: no collectives)
timeout ${PROFILE_S:-170} python3 -m planner profile --out /tmp/prof --json ${PROFILE_ARGS:-} > "$OUT/profile.json" 2> "$LOGS/profile.log"
cp /tmp/prof/cluster.yaml "$OUT/cluster.yaml" 2>/dev/null

# 2. what the profile does not measure, beside the model's figures (issue 23, item 4)
timeout ${CURVES_S:-130} python3 bench/device_curves.py --json "$OUT/device_curves.json" ${CURVES_ARGS:-} > "$LOGS/device_curves.txt" 2>&1
# the runtime's own step kernel by kernel (GEMM, attention, the rest; the host's share), by micro-batch
timeout ${STEP_S:-90} python3 bench/device_step.py --model gpt3-1.3b --mbs 1,8 --time-limit 60 ${STEP_ARGS:-} \
  --json "$OUT/device_step.json" > "$LOGS/device_step.txt" 2>&1

# 3. the GPU-marked tests (1B training against prediction, serving, quick profile vs datasheet)
timeout ${TESTS_S:-110} python3 -m pytest tests -q -m gpu -s -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1

# 4. plan a 1B model for this GPU's measured profile and run it: predicted against measured
if [ -f /tmp/prof/cluster.yaml ] && python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  python3 -m planner plan --model gpt3-1.3b --cluster /tmp/prof/cluster.yaml --gpus 1 --global-batch 8 \
    --seq-len 2048 --target builtin --out /tmp/gpt-1b.yaml > "$LOGS/plan.txt" 2>&1 \
  && timeout 60 python3 -m planner launch /tmp/gpt-1b.yaml --steps 10 > "$OUT/launch.txt" 2>&1
fi
# at most 8 files come back: the logs and the profile's raw rows travel as one archive
tar czf "$OUT/logs.tgz" -C / "${LOGS#/}" tmp/prof 2>/dev/null
tail -n 5 "$LOGS"/*.log "$OUT"/*.log "$OUT/launch.txt" 2>/dev/null
cat "$LOGS/device_curves.txt" "$LOGS/device_step.txt" 2>/dev/null
