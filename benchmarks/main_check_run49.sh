#!/usr/bin/env bash
# Run 49's device call. Library A is main's; library B is main with benchmarks/linear_staged_run49.diff: the down and
# d_x kinds' bf16 D staged in shared memory and stored by TMA through one ragged map per segment
# (csrc/epilogue_linear_staged.cuh), so no D tensor map is rewritten when a CTA's next tile is in another group (run
# 46 put that at about 5% of Qwen3-30B-A3B's down launch). Steps, each logged under $OUT, each given what is left of
# BUDGET_S (seconds, default 560):
#   bits     benchmarks/variant_bits.py under A by the rule, and under B by the rule and in variants 0, 3 and 5 (every
#            tile the two kinds run), and under M (MOK_FAST_LIB_M, when set) by the rule, compared bit for bit with A
#            ($OUT/bits.log). M: the library main was measured with in run 49 (.build/b49m), before the review mend
#            that A (.build/b49r) adds: the staged epilogues' host code written once;
#   gpu      with B: the GPU tests GPU_TESTS (default tests/gpu, every one) ($OUT/gpu_tests.log);
#   groups   benchmarks/bench_group_changes.py (the down launch over E routed / E even / E/8 even / 1 group) on
#            GROUP_CONFIGS, variants 0, 3 and 5, under A then B ($OUT/groups_A.log, $OUT/groups_B.log): B's "E even"
#            should come near its "E/8 even" where A's did not;
#   profile  benchmarks/profile_fast.py of PROFILE_CONFIGS under A then B ($OUT/profiles.log; the bf16-out launches
#            shown);
#   ab       whole steps (energy_probe.py) of AB_WORKLOADS under each of AB_LIBS (default "B A"; "B A M" also times
#            the mend against M) in each of AB_ROUNDS rounds (default 2) ($OUT/energy_ab.log);
#   tall     under library A, whole steps of TALL_WORKLOADS in TALL_ROUNDS rounds (default 2; $OUT/energy_tall.log):
#            four shapes whose down and d_x GEMMs the rule runs in variant 5 (cooperative 256x128 in 1x2 clusters,
#            chosen on an H100 in run 41), each by the rule and with those two kinds forced to variant 3 (ping-pong
#            128x192, the rule's before). For an H200: its run 49 profile had Qwen3-30B-A3B's down and d_x launches at
#            0.725 and 1.323 ms, against 0.62 and 1.19 in ping-pong in run 38's.
# Printing steps for the CPU checks (tests/test_device_scripts.py): groups-configs, ab-workloads, tall-workloads.
# Usage (repo root, the libraries carried; B built here: git apply the diff, compile gemm_tn_bf16.cu and
# gemm_nn_bf16.cu (the units that instantiate the two kinds), relink with main's other objects, git apply -R it):
#   MOK_FAST_LIB_A=$PWD/.build/b49r/libmok_fast.so MOK_FAST_LIB_B=$PWD/.build/b49l/libmok_fast.so \
#     MOK_FAST_LIB_M=$PWD/.build/b49m/libmok_fast.so AB_LIBS="B A M" BUDGET_S=560 \
#     bash benchmarks/main_check_run49.sh bits groups ab   (then: gpu tall profile)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GROUP_CONFIGS=qwen3-30b-a3b,olmoe-1b-7b,mid-64e,dsv3-ep8-slice,mixtral-8x7b
PROFILE_CONFIGS="qwen3-30b-a3b mid-64e dsv3-ep8-slice"
AB_WORKLOADS="mok:qwen3-30b-a3b mok:olmoe-1b-7b mok:mid-64e@S0 mok:dsv3-ep8-slice@S0 mok:mixtral-8x7b"
source "$(dirname "$0")/workload_pairs.sh"
TALL_WORKLOADS=$(pairs "+MOK_FAST_GEMM_VARIANT=,3,,3,,,,," qwen3-30b-a3b olmoe-1b-7b mid-64e@S0 glm-4.5-air)
source "$(dirname "$0")/device_budget.sh"
rm -f /tmp/bits_A_vrule.pt
for step in "$@"; do
  case $step in
    bits) echo "== bits ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
          runs=(B: B:0 B:3 B:5); [ -n "${MOK_FAST_LIB_M:-}" ] && runs+=(M:)
          bits_against_a bits.log "${runs[@]}";;
    gpu) echo "== gpu ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
         MOK_FAST_LIB=$(lib B) timeout "$(cap 300)" python -m pytest ${GPU_TESTS:-tests/gpu} -q -p no:cacheprovider \
           2>&1 | tee "$OUT/gpu_tests.log" | tail -4;;
    groups) echo "== groups ($(left) s left)"; group_changes A B;;
    profile) echo "== profile ($(left) s left)"
             for l in A B; do for c in $PROFILE_CONFIGS; do
               echo "#### library $l, $c" >> "$OUT/profiles.log"
               MOK_FAST_LIB=$(lib $l) timeout "$(cap 40)" python benchmarks/profile_fast.py "$c" 2>&1 \
                 | grep -v -i warn >> "$OUT/profiles.log"
             done; done
             grep -E "^####|bf16-out" "$OUT/profiles.log";;
    ab) echo "== ab ($(left) s left)"
        for r in $(seq 1 "${AB_ROUNDS:-2}"); do for l in ${AB_LIBS:-B A}; do ab_round "$r" "$l"; done; done;;
    tall) echo "== tall ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
          MOK_FAST_LIB=$(lib A) energy energy_tall.log 12 300 $TALL_WORKLOADS --rounds "${TALL_ROUNDS:-2}";;
    groups-configs) echo $GROUP_CONFIGS;;
    tall-workloads) echo $TALL_WORKLOADS;;
    ab-workloads) echo $AB_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in *-configs|*-workloads) ;; *) date -u;; esac
done
