#!/usr/bin/env bash
# Prepare, on this machine, what scripts/gpu_window.sh needs on the GPU machine, in .gpu/ (git-ignored through
# .git/info/exclude, carried along with the working tree: about 50 MB of the 64 MiB that may travel):
#   .gpu/whl        the wheels the GPU machine lacks: the kit's list (KIT/wheels.txt) and matplotlib's, which a
#                   learner's run imports to draw its curves (scripts/box_python.py lists what that machine has)
#   .gpu/skeleton   the converted default-model cache without its weights (make_model.py draws random ones there)
#   .gpu/make_model.py
# KIT is the GPU kit's folder (default ../shared/gpu); the cache is LLM_ENVS_CACHE's (run anything that loads the
# default model once first).
#
#     bash scripts/gpu_kit.sh
set -euo pipefail
KIT=${KIT:-../shared/gpu}
CACHE=${LLM_ENVS_CACHE:-$HOME/.cache/llm-envs}/models/SmolLM2-135M-Instruct
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
mkdir -p .gpu/whl .gpu/skeleton
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .gpu/whl "$@"
}
# shellcheck disable=SC2046  # one package a word
download $(grep -v '^#' "$KIT/wheels.txt")
download matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six
cp "$KIT/make_model.py" .gpu/
(cd "$CACHE" && tar -c --exclude='*.safetensors' tokenizer model) | tar -x -C .gpu/skeleton
du -sh .gpu
