#!/usr/bin/env bash
# ws3's second device call (session 5): the persistent wgmma body taking its next item at an
# item's start (bench_prefill variant 5) or once the item's last tile is issued (6), against the
# shipped body (0), same binary; two prefill tests (every wgmma case also on variant 6's kernel)
# first. Carry build/dev-ws3. Logs to $OUT.
set -u; bin=$PWD/build/dev-ws3/bin; export LD_LIBRARY_PATH=$bin; cd "$bin"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; date -u
timeout 60 ./test_prefill_cuda --gtest_filter='PrefillCuda.SmallMixedForSanitizers:PrefillCuda.RaggedQueryLengthsAfterCachedPrefixes' \
  > "$OUT/ws3b-tests.log" 2>&1; echo "test_prefill_cuda rc=$?"; grep -E "OK|FAILED|PASSED" "$OUT/ws3b-tests.log"
timeout 100 ./bench_prefill --benchmark_filter='gemm_ceiling|variant:[056]/' --benchmark_out="$OUT/bench_prefill.json" \
  --benchmark_out_format=json --benchmark_counters_tabular=true > "$OUT/bench_prefill.log" 2>&1
echo "bench_prefill rc=$?"; date -u
python3 - "$OUT/bench_prefill.json" <<'PY'
import json, sys, re
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if not b["name"].startswith("prefill/"):
        if "gemm" in b["name"]: print("gemm", round(b.get("TFLOPs", 0), 1))
        continue
    a = dict(re.findall(r"(\w+):(\d+)", b["name"]))
    rows.setdefault((a["shape"], a["batch"], a["hkv"], a["bs"], a["identity"]), {})[a["variant"]] = (b.get("TFLOPs", 0), b.get("max_diff_vs_shipped", 0))
print("shape batch hkv bs id | v0 | v5 | v6 | v5/v0 | v6/v0 | maxdiff 5 6")
for k, v in sorted(rows.items()):
    if all(x in v for x in "056"):
        print(*k, "|", *(round(v[x][0], 1) for x in "056"), "|", round(v["5"][0] / v["0"][0], 3), round(v["6"][0] / v["0"][0], 3), "|", v["5"][1], v["6"][1])
PY
