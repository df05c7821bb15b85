#!/usr/bin/env bash
# Installs what pagedkv's build, tests and benchmarks need on Debian 12. Idempotent: packages that
# are already there are not fetched again.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config googletest libgtest-dev libbenchmark-dev librapidcheck-dev
          libxxhash-dev nlohmann-json3-dev libcli11-dev gnuplot-nox
          libopenblas-dev                # examples/llama: the CPU model's matrix products
          libcpp-httplib-dev             # examples/llama: pagedkv-llama serve's HTTP server
          libmsgpack-cxx-dev             # include/pagedkv/kv_events.hpp: KV events in vLLM's msgpack schema
          python3                        # scripts/fetch-model.sh (the runner's model tests)
          python3-venv                   # scripts/python-venv.sh: the msgspec and openai client tests
          python3-xxhash                 # tools/block_hash.py: the hashing spec's Python reference
          clang libclang-rt-14-dev)      # scripts/fuzz.sh: libFuzzer (skipped when absent)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "pagedkv: installing ${missing[*]}"
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# nvcc is optional; put the toolkit on PATH when it is installed in the usual place.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "pagedkv: nvcc found in /usr/local/cuda/bin (add it to PATH to build the CUDA targets by hand)"
fi
