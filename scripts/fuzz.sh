#!/usr/bin/env bash
# Builds the LLaMA runner's libFuzzer targets (GGUF, safetensors, tokenizer) with clang, ASan and
# UBSan, and fuzzes each for a while, starting from the committed seed corpus in tests/fuzz/corpus.
# New inputs go to build/fuzz/corpus-<target> (not the repository); a crash leaves its input in
# build/fuzz/artifacts/ and fails the script: fix it, then add the input to tests/fuzz/corpus so the
# corpus-replay ctest keeps it fixed.
#
#   scripts/fuzz.sh [seconds per target, default 25] [target...]
#
# Skips (exit 0) when no clang with libFuzzer is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-25}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(gguf safetensors tokenizer)

clang=""
for candidate in clang++ clang++-16 clang++-15 clang++-14; do
  if command -v "$candidate" >/dev/null; then clang=$(command -v "$candidate"); break; fi
done
if [[ -z $clang ]] || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$clang" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "pagedkv fuzz: no clang with libFuzzer found; skipping the fuzzing pass"
  exit 0
fi

build=build/fuzz
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$clang" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPAGEDKV_BUILD_FUZZERS=ON -DPAGEDKV_ENABLE_CUDA=OFF -DPAGEDKV_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" --target "${targets[@]/#/fuzz_}" -j "$(nproc)"
mkdir -p "$build/artifacts"
for target in "${targets[@]}"; do
  corpus="$build/corpus-$target"
  mkdir -p "$corpus"
  echo "==== pagedkv fuzz: $target for ${seconds}s ===="
  # -max_len: the seed GGUFs are ~18 KB; -rss_limit_mb: a parser that allocates by a hostile count
  # shows up as an out-of-memory finding instead of swapping.
  log="$build/fuzz-$target.log"
  status=0
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$build/tests/fuzz/fuzz_$target" "$corpus" "tests/fuzz/corpus/$target" \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$target-" >"$log" 2>&1 || status=$?
  grep -E "stat::number_of_executed_units|stat::new_units_added" "$log" || true
  if ((status != 0)); then
    grep -E -A30 "^==[0-9]+==ERROR|runtime error|SUMMARY|deadly signal|Test unit written" "$log" | head -60
    echo "pagedkv fuzz: $target found a problem (full log: $log; input in $build/artifacts)"
    exit 1
  fi
done
echo "==== pagedkv fuzz: no findings ===="
