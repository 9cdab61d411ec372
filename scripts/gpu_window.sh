#!/usr/bin/env bash
# The GPU measurements of issue #48 in one budgeted run (about 8 minutes), for a short window on a GPU machine that
# has a CUDA torch, transformers and peft but not the rest (../shared/gpu/README.md: the kit). From the
# project's root, with the kit in .gpu/ (wheels in .gpu/whl, a weightless default-model cache in
# .gpu/skeleton, steps.sh and make_model.py copied from ../shared/gpu/) and OUT set to a folder that comes back:
#
#     BUDGET=480 bash scripts/gpu_window.sh        # then read $OUT/summary.txt (one line a step);
#                                                  # each bench's JSON is in $OUT/measured/<step>.json
#
# Each step's last output line is a bench's JSON or pytest's summary; $OUT/logs.txt has everything. In order of
# what the issue needs most (a step that no longer fits the budget is skipped, and says so):
#   magrpo*x1   the two-agent MAGRPO run of the issue (one prompt of 4 samples an iteration, 48 new tokens):
#               s_per_iteration with its rollout_s and update_s (targets <= 0.5 s and <= 0.25 s), the first
#               iteration, peak_gpu_gib; random weights of SmolLM2's 135M and 1.7B shapes
#   tests       make test-gpu: the tally (the two-process tests skip, saying why, on a one-GPU machine)
#   magrpo*     bench/magrpo_step.py's own workload (8 prompts x 4 samples an agent), beside it
#   decode*     the decode step with the CUDA graph: ms a step and the floor (targets 135M <= 2 ms at 32 and
#               256 rows, 1.7B <= 3 ms at 32 rows), first call
set -u
: "${OUT:?set OUT to a folder whose files come back}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
BUDGET=${BUDGET:-480}
source .gpu/steps.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$SUM" 2>&1
git log -1 --format='commit %h %s' >> "$SUM" 2>/dev/null
[ -d /tmp/c135 ] || python3 .gpu/make_model.py .gpu/skeleton /tmp/c135 --size 135m > /dev/null 2>&1
export LLM_ENVS_CACHE=/tmp/c135
# A bench step's JSON (its last line) also goes whole to $OUT/measured/<step>.json: the summary cuts lines,
# and the docs' GPU figures are rendered from JSON kept in the repo (copy them to bench/measured/gpu/).
mkdir -p "$OUT/measured"
bench() {
  local name=$1; rm -f /tmp/step.log; step "$@"  # (a skipped step leaves no log)
  [ -f /tmp/step.log ] && tail -n 1 /tmp/step.log | python3 -c "import json,sys; json.loads(sys.stdin.read())" \
    2>/dev/null && tail -n 1 /tmp/step.log > "$OUT/measured/$name.json"
}
bench magrpo135x1 45 python3 bench/magrpo_step.py --device cuda --shape 135m --problems 1 --iterations 8
bench magrpo17bx1 60 python3 bench/magrpo_step.py --device cuda --shape 1.7b --problems 1 --iterations 8
step tests 150 make test-gpu GPU_PY=python3 GPU_WORKERS=8
bench magrpo135 45 python3 bench/magrpo_step.py --device cuda --shape 135m --iterations 3
bench magrpo17b 60 python3 bench/magrpo_step.py --device cuda --shape 1.7b --iterations 3
bench decode135 45 python3 bench/decode_step.py --device cuda --shape 135m --rows 32 256 --modes graph --no-baselines
bench decode17b 50 python3 bench/decode_step.py --device cuda --shape 1.7b --rows 32 --modes graph --no-baselines
grep -E "^(FAILED|ERROR)|^E  |SKIPPED" "$LOG" | head -120 > "$OUT/failures.txt"
cat "$SUM"
