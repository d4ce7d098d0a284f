#!/usr/bin/env bash
# Run 46's device calls. Library A is main's; library B is main with benchmarks/reg_epilogue_run46.diff, the linear
# epilogue stored from registers (csrc/epilogue_linear_reg.cuh: no D tensor map, so no rewrite and fence when a
# consumer warpgroup's next tile is in another group; no shared memory for the epilogue), or with
# benchmarks/reg_epilogue16_run46.diff, the same storing 16-byte runs gathered by quad shuffles (.build/b46v4). Steps, each logged under $OUT, each given what is left of
# BUDGET_S (seconds, default 560):
#   bits     benchmarks/variant_bits.py under A and B, each by the rule and in variants 0, 3 and 5, compared bit for
#            bit with A by the rule ($OUT/bits.log);
#   groups   benchmarks/bench_group_changes.py (the down launch over E routed / E even / E/8 even / 1 group) on
#            GROUP_CONFIGS, variants 0, 3 and 5, under A then B ($OUT/groups_A.log, $OUT/groups_B.log);
#   profile  benchmarks/profile_fast.py on PROFILE_CONFIGS under A and B, one process each ($OUT/profile_{A,B}.log);
#   ab       whole steps (energy_probe.py) of AB_WORKLOADS, library A then B, two rounds ($OUT/energy_ab.log);
#   gpu      with B: every GPU test (tests/gpu) ($OUT/gpu_tests.log).
# Printing steps for the CPU checks (tests/test_device_scripts.py): groups-configs, ab-workloads.
# Usage (repo root, both libraries carried; B built here: git apply the diff, MOK_FAST_JOBS=2 python -m
# mok.fast._build OUT.so, git apply -R it):
#   MOK_FAST_LIB_A=$PWD/.build/b41gs/libmok_fast.so MOK_FAST_LIB_B=$PWD/.build/b46re/libmok_fast.so BUDGET_S=560 \
#     bash benchmarks/main_check_run46.sh bits groups profile ab
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GROUP_CONFIGS=qwen3-30b-a3b,olmoe-1b-7b,mid-64e,dsv3-ep8-slice,mixtral-8x7b
PROFILE_CONFIGS="qwen3-30b-a3b mid-64e dsv3-ep8-slice"
AB_WORKLOADS="mok:qwen3-30b-a3b mok:olmoe-1b-7b mok:mid-64e@S0 mok:dsv3-ep8-slice@S0 mok:mixtral-8x7b"
source "$(dirname "$0")/device_budget.sh"
for step in "$@"; do
  case $step in
    bits) echo "== bits ($(left) s left)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
          for l in A B; do for v in "" 0 3 5; do
            MOK_FAST_LIB=$(lib $l) MOK_FAST_GEMM_VARIANT=$v timeout "$(cap 60)" python benchmarks/variant_bits.py \
              --save "/tmp/bits_${l}_v${v:-rule}.pt" 2>&1 | grep -v -i warn
          done; done
          python benchmarks/variant_bits.py --compare /tmp/bits_A_vrule.pt /tmp/bits_A_v{0,3,5}.pt \
            /tmp/bits_B_v{rule,0,3,5}.pt 2>&1 | tee "$OUT/bits.log" | tail -12;;
    groups) echo "== groups ($(left) s left)"; group_changes A B;;
    profile) echo "== profile ($(left) s left)"
             for l in A B; do for c in $PROFILE_CONFIGS; do
               MOK_FAST_LIB=$(lib $l) timeout "$(cap 60)" python benchmarks/profile_fast.py $c 2>&1 | grep -v -i warn
             done > "$OUT/profile_$l.log"; grep -c "cutlass" "$OUT/profile_$l.log"; done;;
    ab) echo "== ab ($(left) s left)"; ab_rounds 2;;
    gpu) echo "== gpu ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
         MOK_FAST_LIB=$MOK_FAST_LIB_B timeout "$(cap 300)" python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 \
           | tee "$OUT/gpu_tests.log" | tail -4;;
    groups-configs) echo $GROUP_CONFIGS;;
    ab-workloads) echo $AB_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in groups-configs|ab-workloads) ;; *) date -u;; esac
done
