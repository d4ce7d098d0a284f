#!/usr/bin/env bash
# Run 25's first device call on main (one call under the 10-minute limit, the most needed step first):
# 1. the five public shapes added to the suite in run 25 (Llama-4-Scout, DBRX, gpt-oss-20b / 120b,
#    Qwen1.5-MoE-A2.7B) against the grouped_mm path, never run on a GPU before;
# 2. the GPU tests and `mok verify --device cuda` on this tree (runs 24 and 25 changed GPU test files and the
#    expert-parallel pre-flights without a GPU);
# 3. with the time left, the same five shapes at steady state (energy_probe, mok against the grouped_mm path,
#    two rounds).
# Usage (repo root, a library built from this tree): MOK_FAST_LIB=.build/main/libmok_fast.so bash benchmarks/main_check_run25.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
END=$((SECONDS + ${BUDGET_S:-570}))
left() { echo $((END - SECONDS)); }
NEW="llama-4-scout,dbrx,gpt-oss-20b,gpt-oss-120b,qwen1.5-moe-a2.7b"
W="matmul"
for c in ${NEW//,/ }; do W="$W mok:$c grouped_mm:$c"; done
case ${1:-all} in
  workloads) echo $W; exit 0;;  # the energy step's list, for a CPU check that each parses (tests/test_device_scripts.py)
  configs) echo $NEW; exit 0;;  # the suite step's --configs, for the same check
  all) ;;
  *) echo "unknown step $1"; exit 2;;
esac
date -u; git log --oneline -1 2>/dev/null
timeout 200 python benchmarks/bench_moe.py --suite --weight-grads bf16 --configs $NEW 2>&1 | grep -v -i warn \
  | tee "$OUT/suite_new.log" | tail -25
date -u; echo "seconds left: $(left)"
timeout 230 python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
timeout 40 python -m mok.harness.cli verify --device cuda 2>&1 | tee "$OUT/verify.log" | tail -2
date -u; echo "seconds left: $(left)"
E_S=$(( $(left) - 10 ))
[ "$E_S" -gt 60 ] && timeout $E_S python benchmarks/energy_probe.py $W --rounds 2 --seconds 3 --cool 1.5 2>&1 \
  | tee "$OUT/energy_new.log" | tail -14
date -u
