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
passed=0
failed=0
skipped=0
for preset in release debug-asan tsan; do
  echo "==== pagedkv: $preset ===="
  cmake --preset "$preset" >/dev/null
  target=all
  [[ $preset == tsan ]] && target=pagedkv_tsan_tests  # ThreadSanitizer runs the threaded tests only
  cmake --build --preset "$preset" -j "$jobs" --target "$target"
  log=build/$preset/ctest.log
  status=0
  ctest --preset "$preset" -j "$jobs" 2>&1 | tee "$log" || status=$?
  # "100% tests passed, 0 tests failed out of 181"
  if summary=$(grep -Eo '[0-9]+ tests failed out of [0-9]+' "$log"); then
    read -r bad _ _ _ _ total <<<"$summary"
    skips=$(grep -c '\*\*\*Skipped' "$log" || true)  # the CUDA tests, on a machine without a GPU
    passed=$((passed + total - bad - skips))
    failed=$((failed + bad))
    skipped=$((skipped + skips))
  fi
  ((status == 0)) || { echo "$passed passed, $((failed > 0 ? failed : 1)) failed"; exit 1; }
done
# A short fuzzing pass over the LLaMA runner's file readers and tokenizer (skipped without clang).
scripts/fuzz.sh 20
echo "==== pagedkv: all tests passed (release, ASan+UBSan, TSan, fuzzing) ===="
echo "$passed passed, $failed failed, $skipped skipped"
