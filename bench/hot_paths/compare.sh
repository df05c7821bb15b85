#!/bin/sh
# Builds hot_paths.cpp against this tree and against revision $1 (default main) into one binary
# and runs both, interleaved and repeated: the same run compares the manager's hot paths.
#   bench/hot_paths/compare.sh <rev> [benchmark flags]
set -eu
rev=${1:-main}
[ $# -gt 0 ] && shift
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${TMPDIR:-/tmp}/pagedkv-hot-paths
rm -rf "$out" && mkdir -p "$out/base"
git -C "$here" archive "$rev" include | tar -x -C "$out/base"
flags="-std=c++20 -O3 -DNDEBUG"
g++ $flags -I"$out/base/include" -Dpagedkv=pagedkv_base -DPAGEDKV_HOT_PATHS_NS=pagedkv_base \
    -DPAGEDKV_HOT_PATHS_VARIANT="\"before\"" -c "$here/bench/hot_paths/hot_paths.cpp" -o "$out/before.o"
g++ $flags -I"$here/include" -DPAGEDKV_HOT_PATHS_NS=pagedkv \
    -DPAGEDKV_HOT_PATHS_VARIANT="\"after\"" -c "$here/bench/hot_paths/hot_paths.cpp" -o "$out/after.o"
g++ "$out/before.o" "$out/after.o" -lbenchmark_main -lbenchmark -lpthread -o "$out/hot_paths"
"$out/hot_paths" --benchmark_enable_random_interleaving=true --benchmark_repetitions=10 \
    --benchmark_report_aggregates_only=true "$@"
