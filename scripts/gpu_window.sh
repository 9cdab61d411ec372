#!/usr/bin/env bash
# The GPU checks of issue #37 in one budgeted run (about 8 minutes), for a short window on a GPU machine that
# has a CUDA torch, transformers and peft but not the rest (../shared/gpu/README.md: the kit). From the
# project's root, with the kit in .gpu/ (wheels in .gpu/whl, a weightless default-model cache in
# .gpu/skeleton, steps.sh and make_model.py copied from ../shared/gpu/) and OUT set to a folder that comes back:
#
#     BUDGET=480 bash scripts/gpu_window.sh        # then read $OUT/summary.txt (one line a step)
#
# Each step's last output line is a bench's JSON or pytest's summary; $OUT/logs.txt has everything.
set -u
: "${OUT:?set OUT to a folder whose files come back}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
BUDGET=${BUDGET:-480}
source .gpu/steps.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$SUM" 2>&1
[ -d /tmp/c135 ] || python3 .gpu/make_model.py .gpu/skeleton /tmp/c135 --size 135m > /dev/null 2>&1
export LLM_ENVS_CACHE=/tmp/c135
step tests 150 make test-gpu GPU_PY=python3 GPU_WORKERS=8
step decode135 60 python3 bench/decode_step.py --device cuda --shape 135m --rows 32 256 --modes dynamic graph --profile
step decode135c 70 python3 bench/decode_step.py --device cuda --shape 135m --rows 32 256 --modes graph+compile --no-baselines
step decode17b 90 python3 bench/decode_step.py --device cuda --shape 1.7b --rows 32 --modes graph graph+compile --profile
step magrpo135 60 python3 bench/magrpo_step.py --device cuda --shape 135m --iterations 4
step magrpo17b 80 python3 bench/magrpo_step.py --device cuda --shape 1.7b --iterations 4
grep -E "^(FAILED|ERROR)|^E  " "$LOG" | head -120 > "$OUT/failures.txt"
cat "$SUM"
