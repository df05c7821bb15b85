#!/usr/bin/env bash
# Builds and runs every test: the release build (with the CUDA targets compiled when nvcc is
# there), the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer, and the
# threaded tests (label tsan) under ThreadSanitizer, then a short libFuzzer pass when clang is installed.
# Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
jobs=$(nproc)
for preset in release debug-asan tsan; do
  echo "==== pagedkv: $preset ===="
  cmake --preset "$preset" >/dev/null
  target=all
  [[ $preset == tsan ]] && target=pagedkv_tsan_tests  # ThreadSanitizer runs the threaded tests only
  cmake --build --preset "$preset" -j "$jobs" --target "$target"
  ctest --preset "$preset" -j "$jobs"
done
# A short fuzzing pass over the LLaMA runner's file readers and tokenizer (skipped without clang).
scripts/fuzz.sh 20
echo "==== pagedkv: all tests passed ===="
