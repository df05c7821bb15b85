#!/usr/bin/env bash
# Tensor parallelism's device run (issue 24), in one call on two GPUs (kind nvidia-h100-x2): the
# TP backend's tests against one GPU (test_tp_backend; the four failure tests each in a process of
# their own: an aborted communicator may leave its GPU's context unusable; one that hangs gets its
# threads' stacks taken by cuda-gdb before it is killed), NCCL's own all-reduce at a decode step's
# message sizes under each NCCL setting tried (nccl_sweep, one process each), then the benchmark of
# pagedkv-llama at --tensor-parallel-size 1 and 2 (decode graphs, TP's default), 2 with
# --enforce-eager (every step's all-reduces timed: the graphs' are not by default), and rank 0's
# shard alone on one GPU (SHAPE@tp2: the TP step without its communication), on the issue's
# workload, each TP run printing its all-reduce time beside NCCL's own time for the same messages.
# Run from a folder holding pagedkv-llama, test_tp_backend (test_cuda_backend too, if there),
# nccl_sweep and blas.tar.xz (the host libraries the device lacks: OpenBLAS and its runtime,
# cpp-httplib and brotli); writes under $OUT. One device call, with that folder at build/<name> of
# the checkout and carried:  bash build/<name>/run_tp_device.sh all   (kind nvidia-h100-x2; BENCH_TIMEOUT and
# TEST_TIMEOUT, seconds, bound each benchmark run and the main test run: 120 and 300 by default; FAIL_LIMIT
# each failure test: 40)
#   run_tp_device.sh test | sweep | bench | profile | graphs | peer | tp1 | all | a comma-separated list   [shapes...]   (default shapes: llama2-13b llama3-8b)
# profile: llama2-13b only, TP2 eager with and without asynchronous scheduling, and its shard alone
# with graphs and asynchronous scheduling and without either (where the TP2 step's time goes).
# graphs: TP2 eager (--enforce-eager), with decode graphs (the default: their collectives untimed)
# and with --tensor-parallel-timed-graphs (what timing events inside the graphs cost), on the first
# shape, side by side. peer: TP2 with the peer reduce (the default), with
# --tensor-parallel-nccl-all-reduce, and both with --enforce-eager (every all-reduce timed), on the first
# shape. tp1: TP1 (graphs) on the first shape (the ratio's other side).
set -u
cd "$(dirname "$0")"
mkdir -p lib && tar xJf blas.tar.xz -C lib
# NCCL: the nvidia-nccl-cu13 wheel's library, opened at run time by pagedkv (nccl_library.cpp).
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null)
[[ -n $nccl_dir ]] && nccl_dir=$nccl_dir/lib
if [[ -z $nccl_dir || ! -e $nccl_dir/libnccl.so.2 ]]; then  # else the first libnccl.so.2 of the Python install
  nccl_lib=$(find /opt /usr -name libnccl.so.2 -path '*nvidia*' 2>/dev/null | head -1)
  nccl_dir=${nccl_lib:+$(dirname "$nccl_lib")}
fi
export LD_LIBRARY_PATH=$PWD/lib:$PWD${nccl_dir:+:$nccl_dir}
export NCCL_NVLS_ENABLE=0  # no NVLink multicast on these machines (pagedkv sets it too)
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # NCCL's own word on a failed call or capture
# The goldens: PAGEDKV_GOLDEN_DIR, else the checkout's (this folder at build/<name> or bench/engine in it).
if [[ -z ${PAGEDKV_GOLDEN_DIR:-} ]]; then
  for d in ../../tests/runner/golden "$(git rev-parse --show-toplevel 2>/dev/null)/tests/runner/golden"; do
    [[ -d $d ]] && PAGEDKV_GOLDEN_DIR=$(cd "$d" && pwd) && break
  done
fi
export PAGEDKV_GOLDEN_DIR
out=${OUT:-/tmp/pagedkv-out}
mkdir -p "$out"
log=$out/tp.log
mode=${1:-all}  # or several, comma-separated: test,sweep,profile
shift || true
want() { [[ $mode == all || ,$mode, == *,$1,* ]]; }
if (($#)); then shapes=("$@"); else shapes=(llama2-13b llama3-8b); fi
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,memory.total --format=csv; nvidia-smi topo -m; date -u
  echo "NCCL from ${nccl_dir:-(not found: the wheel nvidia-nccl-cu13)}"; } | tee "$log"
# A test run in the background; if it is still running after $2 s, its threads' stacks (cuda-gdb)
# go to $out/stacks_NAME.txt and it is killed: a hang shows where it hangs.
run_bounded() {
  local name=$1 limit=$2
  shift 2
  "$@" >> "$log" 2>&1 &
  local pid=$! waited=0
  while kill -0 "$pid" 2>/dev/null && ((waited < limit)); do sleep 1; waited=$((waited + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    timeout 40 cuda-gdb -p "$pid" -batch -ex "info threads" -ex "thread apply all bt" > "$out/stacks_$name.txt" 2>&1
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    echo "$name rc=hung (killed after $limit s; stacks in stacks_$name.txt)" >> "$log"
  else
    wait "$pid"
    echo "$name rc=$?" >> "$log"
  fi
}
if want test; then
  # The one-GPU backend's tests too when the folder holds them (the two share the model's kernels).
  if [[ -x ./test_cuda_backend ]]; then timeout 120 ./test_cuda_backend >> "$log" 2>&1; echo "test_cuda_backend rc=$?" >> "$log"; fi
  timeout "${TEST_TIMEOUT:-300}" ./test_tp_backend --gtest_filter='-*Failing*:*Hung*' >> "$log" 2>&1; echo "test_tp_backend rc=$?" >> "$log"
  for t in AFailingRankEndsTheStepWithoutAHang AHungRankIsAbortedAtTheDeadline AFailingRankEndsAGraphReplayWithoutAHang \
           AHungRankInAGraphReplayIsAbortedAtTheDeadline; do
    run_bounded "$t" "${FAIL_LIMIT:-40}" ./test_tp_backend --gtest_filter="*.$t"
  done
  grep -E "rc=|PASSED|FAILED|Failure|ranks:|threw after|SKIPPED|Expected|Which is" "$log" | head -60
fi
if want sweep && [[ -x ./nccl_sweep ]]; then
  # NCCL's own all-reduce at a decode step's sizes ([tokens, dim] bf16) under each setting tried.
  # (Run of 2026-11-26 09:22 UTC also tried NCCL_PROTO=Simple, NCCL_ALGO=Tree|Ring and
  # NCCL_MAX_NCHANNELS=8: none won at any size; bench/engine/results/2026-11-26-h100x2-tp-profile.log.)
  for setting in "" NCCL_PROTO=LL NCCL_PROTO=LL128 NCCL_PROTO=^Simple; do
    for dim in 5120 4096; do
      env $setting timeout 60 ./nccl_sweep $dim 1 64 128 160 192 256 2048 >> "$log" 2>&1 || echo "nccl_sweep $setting rc=$?" >> "$log"
    done
  done
  # NCCL's symmetric memory (a registered window, SWEEP_SYMMETRIC=1), and which kernel NCCL ran in
  # it at each size (rank 0's TUNING lines, one per all-reduce). pagedkv does not use it: NCCL
  # 2.28's symmetric kernels did not end at ncclCommAbort (docs/journal/tensor-parallel.md).
  for setting in "SWEEP_SYMMETRIC=1 NCCL_PROTO=^Simple" SWEEP_SYMMETRIC=1; do
    env $setting timeout 60 ./nccl_sweep 5120 1 16 64 128 160 192 256 2048 >> "$log" 2>&1 || echo "nccl_sweep $setting rc=$?" >> "$log"
  done
  env SWEEP_SYMMETRIC=1 NCCL_PROTO=^Simple NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING timeout 60 \
    ./nccl_sweep 5120 1 16 64 128 160 192 256 2048 > /tmp/sweep_tuning.txt 2>&1 || echo "nccl_sweep tuning rc=$?" >> "$log"
  grep -oE "AllReduce[^:]*: [0-9]+ Bytes -> [A-Za-z]+ [A-Za-z0-9_]+" /tmp/sweep_tuning.txt | sort | uniq -c \
    | sed 's/^/nccl_sweep tuning: /' >> "$log"
  grep nccl_sweep "$log"
fi
# run_device.sh's workload: 256 ShareGPT-like requests at t=0, EOS ignored, random prompt ids.
common=(--device cuda --bench --bench-requests 256 --bench-length-scale 1 --bench-max-prompt 1024
        --max-tokens 1024 --max-batch-tokens 2048 --max-num-seqs 256 --seed 1)
bench_one() {  # NAME ARGS...: one pagedkv-llama run, its report into the log (BENCH_ENV: NCCL_* for it)
  local name=$1
  shift
  echo "== ${BENCH_ENV:-}${BENCH_ENV:+ }pagedkv-llama $*" >> "$log"
  env ${BENCH_ENV:-} timeout "${BENCH_TIMEOUT:-120}" ./pagedkv-llama "${common[@]}" "$@" >> "$log" 2>"/tmp/bench_$name.err"
  echo "rc=$?" >> "$log"
  tail -3 "/tmp/bench_$name.err" >> "$log"
}
if [[ ,$mode, == *,profile,* ]]; then
  bench_one 13b_tp2 --model-shape llama2-13b --tensor-parallel-size 2 --enforce-eager
  bench_one 13b_tp2_sync --model-shape llama2-13b --tensor-parallel-size 2 --enforce-eager --no-async-scheduling
  bench_one 13b_shard --model-shape llama2-13b@tp2
  bench_one 13b_shard_eager_sync --model-shape llama2-13b@tp2 --enforce-eager --no-async-scheduling
  grep -vE "^\[" "$log" | grep -E "^==|output tokens/s|decode step|decode roofline|decode batch|GPU idle|async|tensor parallel|rc=" | tail -70
fi
if [[ ,$mode, == *,graphs,* ]]; then  # TP2 with decode graphs on the first shape: what the graphs cost now
  bench_one "${shapes[0]}_tp2eager" --model-shape "${shapes[0]}" --tensor-parallel-size 2 --enforce-eager
  bench_one "${shapes[0]}_tp2" --model-shape "${shapes[0]}" --tensor-parallel-size 2
  bench_one "${shapes[0]}_tp2timed" --model-shape "${shapes[0]}" --tensor-parallel-size 2 --tensor-parallel-timed-graphs
fi
if [[ ,$mode, == *,peer,* ]]; then  # the peer reduce (TP's default) against NCCL's all-reduce, and eager (timed)
  bench_one "${shapes[0]}_tp2" --model-shape "${shapes[0]}" --tensor-parallel-size 2
  bench_one "${shapes[0]}_tp2nccl" --model-shape "${shapes[0]}" --tensor-parallel-size 2 --tensor-parallel-nccl-all-reduce
  bench_one "${shapes[0]}_tp2eager" --model-shape "${shapes[0]}" --tensor-parallel-size 2 --enforce-eager
  bench_one "${shapes[0]}_tp2eagernccl" --model-shape "${shapes[0]}" --tensor-parallel-size 2 --enforce-eager \
    --tensor-parallel-nccl-all-reduce
fi
if [[ ,$mode, == *,tp1,* ]]; then bench_one "${shapes[0]}_tp1" --model-shape "${shapes[0]}" --tensor-parallel-size 1; fi
if [[ ,$mode, == *,graphs,* || ,$mode, == *,tp1,* || ,$mode, == *,peer,* ]]; then
  grep -vE "^\[" "$log" | grep -E "^==|output tokens/s|decode step|decode batch|GPU idle|async|CUDA graphs|tensor parallel|rc=" | tail -60
fi
if want bench; then
  for shape in "${shapes[@]}"; do
    # One GPU (CUDA graphs on), two replaying graphs (TP's default), two launching every step (its
    # all-reduces timed), and rank 0's shard alone on one GPU (graphs on).
    bench_one "${shape}_tp1" --model-shape "$shape" --tensor-parallel-size 1
    bench_one "${shape}_tp2" --model-shape "$shape" --tensor-parallel-size 2
    bench_one "${shape}_tp2eager" --model-shape "$shape" --tensor-parallel-size 2 --enforce-eager
    bench_one "${shape}_shard" --model-shape "$shape@tp2"
  done
  # NCCL's own protocol choice among all three (pagedkv sets NCCL_PROTO=^Simple unless it is set).
  BENCH_ENV=NCCL_PROTO=LL,LL128,Simple bench_one "${shapes[0]}_tp2_ncclproto" --model-shape "${shapes[0]}" --tensor-parallel-size 2
  grep -vE "^\[" "$log" | grep -E "^==|output tokens/s|decode step|decode roofline|GPU idle|async|tensor parallel|rc=" | tail -70
fi
