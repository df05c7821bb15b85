# Sourced first by bench/engine's run_*_device.sh, each run from a carried folder at build/<name>
# of a checkout that holds the binaries and blas.tar.xz (openblas, gfortran, quadmath) and
# httplib.tar.xz (cpp-httplib, brotli; run_device.sh says how both are made): enters that folder,
# unpacks the host libraries pagedkv-llama links into lib/, puts lib/ and the folder on
# LD_LIBRARY_PATH, names the checkout's tiny goldens (unless PAGEDKV_GOLDEN_DIR is set) and sets
# $out to $OUT (or /tmp/out), created; engine_tests_and_memcheck runs the engine's GPU tests.
cd "$(dirname "${BASH_SOURCE[1]}")" || exit 1
mkdir -p lib && tar xJf blas.tar.xz -C lib || exit 1
[[ -f httplib.tar.xz ]] && { tar xJf httplib.tar.xz -C lib || exit 1; }
export LD_LIBRARY_PATH=$PWD/lib:$PWD
export PAGEDKV_GOLDEN_DIR=${PAGEDKV_GOLDEN_DIR:-$PWD/../../tests/runner/golden}
out=${OUT:-/tmp/out}
mkdir -p "$out"

# The engine's GPU tests (test_llama_engine's CUDA cases, test_cuda_backend) into $out/tests.log,
# then compute-sanitizer memcheck over test_cuda_backend's cases matching $1 into
# $out/memcheck.log, printing the failures, the exit statuses and the lines matching $2; false
# when any of them failed.
engine_tests_and_memcheck() {
  local filter=$1 show=${2:-FAILED} sanitizer
  { timeout 60 ./test_llama_engine --gtest_filter='*cuda*'; echo "test_llama_engine (cuda) rc=$?"
    timeout 90 ./test_cuda_backend; echo "test_cuda_backend rc=$?"; } > "$out/tests.log" 2>&1
  grep -E "FAILED|rc=|$show" "$out/tests.log"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  { timeout 100 "$sanitizer" --tool memcheck --error-exitcode 99 ./test_cuda_backend \
      --gtest_filter="$filter"
    echo "memcheck test_cuda_backend rc=$?"; } > "$out/memcheck.log" 2>&1
  grep -E "ERROR SUMMARY|rc=|$show" "$out/memcheck.log"
  ! grep -q "rc=[1-9]" "$out/tests.log" "$out/memcheck.log"
}
