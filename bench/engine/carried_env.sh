# Sourced first by bench/engine's run_*_device.sh, each run from a carried folder at build/<name>
# of a checkout that holds the binaries and blas.tar.xz (openblas, gfortran, quadmath) and
# httplib.tar.xz (cpp-httplib, brotli; run_device.sh says how both are made): enters that folder,
# unpacks the host libraries pagedkv-llama links into lib/, puts lib/ and the folder on
# LD_LIBRARY_PATH, names the checkout's tiny goldens (unless PAGEDKV_GOLDEN_DIR is set) and sets
# $out to $OUT (or /tmp/out), created.
cd "$(dirname "${BASH_SOURCE[1]}")" || exit 1
mkdir -p lib && tar xJf blas.tar.xz -C lib || exit 1
[[ -f httplib.tar.xz ]] && { tar xJf httplib.tar.xz -C lib || exit 1; }
export LD_LIBRARY_PATH=$PWD/lib:$PWD
export PAGEDKV_GOLDEN_DIR=${PAGEDKV_GOLDEN_DIR:-$PWD/../../tests/runner/golden}
out=${OUT:-/tmp/out}
mkdir -p "$out"
