#!/usr/bin/env bash
# Issue #63's GPU measurements in one budgeted run, for one short window on the GPU machine (one H100/H200, Python
# 3.12 with a CUDA torch, transformers, peft, accelerate, pytest, pytest-xdist; no network). From the project's
# root, with the kit in .gpu/ (docs/agents.md "On a GPU", "The GPU window": the wheels in .gpu/whl, a weightless
# default-model cache in .gpu/skeleton, make_model.py) and OUT set to a folder whose files come back:
#
#     COMMIT=$(git rev-parse --short HEAD) BUDGET=540 bash scripts/gpu_window.sh
#
# Every step has its own limit and none runs past BUDGET seconds from the start (a step that no longer fits is
# skipped, and says so). $OUT/summary.txt: a line a step (status, seconds, its last output line); $OUT/logs/: each
# step's whole output; $OUT/measured/<step>.json: a bench step's last-line JSON with a `measured` stamp (when,
# load, commit), and window.json (the GPU, the driver, torch and CUDA, the commit, each step's status). Copy them
# into the repo with `python bench/figures.py --gpu-from $OUT/measured`, which renders them into docs/agents.md
# and README.md. The steps, in the order of what issue #63 needs most:
#   magrpo135x1, magrpo17bx1  the two-agent one-prompt MAGRPO iteration (1 prompt x 4 samples, 48 new tokens) at
#               SmolLM2's 135M and 1.7B shapes: s/iteration, rollout, update, first iteration, peak GPU memory
#               (targets <= 0.5 s an iteration, update <= 0.25 s)
#   decode135, decode17b  the engine's decode step on its default CUDA graph: ms a step against the floor, first
#               call, peak memory (targets 135M <= 2 ms at 32 and 256 rows, 1.7B <= 3 ms at 32; first call <= 5 s)
#   test_gpu    make test-gpu, tallied (passed, failed, skipped, the failing ids): the target is green
#   demo        llm-envs train magrpo --preset demo on CUDA, 4 iterations, its metrics read back  } in what the
#   magrpo135   bench/magrpo_step.py's own workload (8 prompts x 4 samples an agent)            } budget has
#   magrpo17b   the same at 1.7B                                                                } left
#
# DRY=1 runs every step on this CPU instead, in seconds: tiny models in every shape (a tiny default-model cache in
# $OUT/dry-cache), a few tokens and iterations, static decode for the graph, a few tests for make test-gpu, each
# Python command through scripts/box_python.py (an import the GPU machine could not satisfy fails, as it would
# there); its limits are SCALE (default 4) times the GPU's, for a CPU shared with other work. LIST=1 prints each
# step (name, limit, command) and runs nothing (tests/test_gpu_window.py parses them). ONLY="decode17b test_gpu"
# runs only those steps (a rerun of what failed; `bench/figures.py --gpu-from FIRST RERUN` merges the two).
# On CUDA the update is compiled by default (compile_update "auto": a few graphs an agent, each compiled at its
# shape's first call, tens of seconds), so the MAGRPO steps' limits leave room for their first iteration. The
# targets' steps (the kit's model 60, then 110, 130, 40, 45, 150) sum to 535 s within BUDGET=540: the command ends
# within 9 minutes, which leaves of a 15-minute device window its start and a short rerun on the warm machine. The
# demo and bench/magrpo_step.py's workload (60 s each, then magrpo17b) run in what the earlier steps leave.
set -u
: "${OUT:?set OUT to a folder whose files come back}"
BUDGET=${BUDGET:-540}
DRY=${DRY:-}
LIST=${LIST:-}
ONLY=${ONLY:-}
SCALE=${SCALE:-$( [ -n "$DRY" ] && echo 4 || echo 1 )}
START=$(date +%s)
mkdir -p "$OUT/measured" "$OUT/logs"
SUM=$OUT/summary.txt
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

if [ -n "$DRY" ]; then
  HOST=${HOST_PY:-.venv/bin/python}
  PY="$HOST scripts/box_python.py"
  DEV=cpu MODES=static ROWS135=8 ROWS17B=8 TOKENS=4 REPEATS=1 ITER_X1=1 ITER=1 DEMO_ITER=2 WORKLOAD="--problems 2"
  DEMO_FLAGS="-- --max-new-tokens 4 --num-eval-problems 1"
  TESTS="$PY -m pytest -q -p no:cacheprovider -m 'not slow' tests/test_decode_graph.py -k 'buckets or captured_graph'"
  export LLM_ENVS_TINY_SHAPES=1 PYTHONPATH=$PWD
else
  HOST=python3 PY=python3
  DEV=cuda MODES=graph ROWS135="32 256" ROWS17B=32 TOKENS=48 REPEATS=3 ITER_X1=8 ITER=3 DEMO_ITER=4 DEMO_FLAGS="" WORKLOAD=""
  TESTS="make test-gpu GPU_PY=python3 GPU_WORKERS=8"
fi

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME LIMIT COMMAND...: run COMMAND under min(LIMIT, what is left of BUDGET less 10 s); a bench's last-line
# JSON goes to $OUT/measured/NAME.json (scripts/window_record.py stamps it).
step() {
  local name=$1 limit=$2; shift 2
  if [ -n "$LIST" ]; then printf '%s\t%s\t%s\n' "$name" "$limit" "$*"; return; fi
  if [ -n "$ONLY" ] && [ "$name" != model ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  limit=$((limit * SCALE))
  local l; l=$(left)
  if [ "$l" -lt 25 ]; then
    echo "SKIP $name (budget left ${l}s)" >> "$SUM"
    $HOST scripts/window_record.py step "$OUT" "$name" skipped 0 "$limit" /dev/null
    return
  fi
  [ "$limit" -gt $((l - 10)) ] && limit=$((l - 10))
  local log=$OUT/logs/$name.log t0; t0=$(date +%s)
  timeout -k 5 "$limit" bash -c "$*" > "$log" 2>&1; local rc=$?
  local seconds=$(( $(date +%s) - t0 ))
  echo "$name rc=$rc ${seconds}s :: $(grep -v '^\s*$' "$log" | tail -1 | cut -c1-2500)" >> "$SUM"
  $HOST scripts/window_record.py step "$OUT" "$name" "$rc" "$seconds" "$limit" "$log"
}

if [ -z "$LIST" ]; then
  if [ -n "$DRY" ]; then
    step model 120 "$HOST scripts/box_python.py --tiny-cache $OUT/dry-cache"
    export LLM_ENVS_CACHE=$OUT/dry-cache
  else
    ls .gpu/whl/*.whl > /dev/null 2>&1 || echo "NO KIT: .gpu/whl has no wheels (bash scripts/gpu_kit.sh, then carry .gpu)" >> "$SUM"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl > "$OUT/logs/pip.log" 2>&1
    export PYTHONPATH=/tmp/site:$PWD
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
    [ -d /tmp/c135 ] || step model 60 "python3 .gpu/make_model.py .gpu/skeleton /tmp/c135 --size 135m"
    export LLM_ENVS_CACHE=/tmp/c135
  fi
fi
step magrpo135x1 110 "$PY bench/magrpo_step.py --device $DEV --shape 135m --problems 1 --iterations $ITER_X1"
step magrpo17bx1 130 "$PY bench/magrpo_step.py --device $DEV --shape 1.7b --problems 1 --iterations $ITER_X1"
step decode135 40 "$PY bench/decode_step.py --device $DEV --shape 135m --rows $ROWS135 --modes $MODES --no-baselines \
--max-new-tokens $TOKENS --repeats $REPEATS"
step decode17b 45 "$PY bench/decode_step.py --device $DEV --shape 1.7b --rows $ROWS17B --modes $MODES --no-baselines \
--max-new-tokens $TOKENS --repeats $REPEATS"
# The tally's own limit stays under the step's, so that pytest is interrupted (and reports) before `timeout` kills.
TALLY_LIMIT=$(( ($(left) - 10 < 150 * SCALE ? $(left) - 10 : 150 * SCALE) - 25 ))
step test_gpu 150 "$PY bench/pytest_tally.py --limit $TALLY_LIMIT -- $TESTS"
step demo 60 "$PY bench/demo_step.py --device $DEV --iterations $DEMO_ITER $DEMO_FLAGS"
step magrpo135 60 "$PY bench/magrpo_step.py --device $DEV --shape 135m --iterations $ITER $WORKLOAD"
step magrpo17b 60 "$PY bench/magrpo_step.py --device $DEV --shape 1.7b --iterations $ITER $WORKLOAD"
[ -n "$LIST" ] && exit 0
$HOST scripts/window_record.py finish "$OUT" "$BUDGET" "$( [ -n "$DRY" ] && echo dry || echo gpu )"
cat "$SUM"
