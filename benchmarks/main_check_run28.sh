#!/usr/bin/env bash
# Run 28's device calls on main (the d_a step fused at every I that 8 splits, the backward freeing what it has read).
# Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560) after the steps before:
#   tests    python -m pytest tests/gpu (the new default had not run the whole GPU suite);
#   energy   energy_probe.py --preset issue13 in two rounds, with the fused d_a kind in the 2x1-cluster ping-pong
#            tile (variant 2) beside the rule's on the two shapes where it was faster alone (run 27's bench_d_act);
#   preset   energy_probe.py --preset issue13 alone, two rounds;
#   suite    bench_moe.py --suite for mok (separate gate and up), mok_gu (one [gate; up] tensor) and the grouped_mm
#            path: time and peak memory with the backward's release_saved, the shapes with the largest
#            concatenation first;
#   suite-peak  the same on the eight shapes whose peak sits at the down gradients (since the backward frees the d_x
#            rows and the x rows before those), stacked ones first;
#   module   bench_moe.py --module on five suite shapes: what a user runs (mok.MoE: router, losses, layer) against a
#            plain PyTorch module, time and each step's peak memory;
#   profile  profile_fast.py, one process per shape of docs/fast_path_measurements.md's per-stage table;
#   ab-wait  whole steps of bc7babc's backward (the main stream waits for the d_x combine at the end, the d_x rows
#            live to the end) against this tree's (it waits once the gate/up gradients are queued and drops them),
#            alternating, two rounds: Qwen3-30B-A3B and Mixtral-8x7B. Needs bc7babc's tree at .dev/bc7_tree
#            (`mkdir -p .dev/bc7_tree && git archive bc7babc mok benchmarks | tar -x -C .dev/bc7_tree`, carried).
# Printing steps for the CPU check (tests/test_device_scripts.py): `workloads`, `configs`, `module-configs`, `peak-configs`.
# Usage (repo root, a library built from this tree):
#   MOK_FAST_LIB=$PWD/.build/cur/libmok_fast.so BUDGET_S=560 bash benchmarks/main_check_run28.sh tests energy suite
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# MokGemmKind order: TN_F32, TN_BF16, NN_F32, NN_BF16, TT_F32, TT_BF16, NN_SWIGLU_BWD, TN_SWIGLU_FWD, TT_F32_SMALL
DA_V2="+MOK_FAST_GEMM_VARIANT=,,,,,,2,,"
WORKLOADS="mok:olmoe-1b-7b mok:olmoe-1b-7b$DA_V2 mok:dsv3-ep8-slice@S0$DA_V2"
CONFIGS=mixtral-8x7b,llama-4-scout,qwen1.5-moe-a2.7b,dbrx,mixtral-8x7b-t8000,mixtral-8x22b,phi-3.5-moe,gpt-oss-20b
CONFIGS=$CONFIGS,deepseek-v2-lite,gpt-oss-120b,qwen3-30b-a3b,qwen3-30b-a3b-t12345,olmoe-1b-7b,granite-3.0-3b-a800m
CONFIGS=$CONFIGS,qwen3-235b-a22b,deepseek-v2-lite-t1000,dsv3-ep8-slice,glm-4.5-air
CONFIGS=$CONFIGS,qwen2-57b-a14b,qwen3-next-80b-a3b,deepseek-v2,grok-1  # added in run 39
PEAK_CONFIGS=llama-4-scout,dbrx,phi-3.5-moe,glm-4.5-air,mixtral-8x22b,qwen3-235b-a22b,gpt-oss-120b,mixtral-8x7b
MODULE_CONFIGS=mixtral-8x7b,qwen3-30b-a3b,olmoe-1b-7b,dsv3-ep8-slice,deepseek-v2-lite-t1000
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
issue13() {  # extra workloads ("" for none), log name, at most this many seconds: the preset in two rounds
  echo "== $2 ($(left) s left)"
  timeout $(( $(left) < $3 ? $(left) : $3 )) python benchmarks/energy_probe.py $1 --preset issue13 --seconds 3 \
    --cool 1.5 --rounds 2 2>&1 | grep -v -i warn | tee "$OUT/$2.log" | tail -24
}
for step in "$@"; do
  case $step in
    workloads) echo $WORKLOADS;;
    configs) echo $CONFIGS;;
    module-configs) echo $MODULE_CONFIGS;;
    peak-configs) echo $PEAK_CONFIGS;;
    tests) date -u; nvidia-smi --query-gpu=name --format=csv,noheader
           timeout $(( $(left) < ${TESTS_S:-200} ? $(left) : ${TESTS_S:-200} )) python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 \
             | tee "$OUT/gpu_tests.log" | tail -3;;
    energy) issue13 "$WORKLOADS" energy_issue13 230;;
    preset) issue13 "" energy_preset $(( $(left) - 5 ));;
    suite) echo "== suite ($(left) s left)"
           timeout $(( $(left) - 5 )) python benchmarks/bench_moe.py --suite --weight-grads bf16 \
             --methods mok,mok_gu,grouped_mm --configs "$CONFIGS" 2>&1 | grep -v -i warn | tee "$OUT/suite.log" | tail -64;;
    suite-peak) echo "== suite-peak ($(left) s left)"
                timeout $(( $(left) < 240 ? $(left) : 240 )) python benchmarks/bench_moe.py --suite --weight-grads bf16 \
                  --methods mok,mok_gu,grouped_mm --configs "$PEAK_CONFIGS" 2>&1 | grep -v -i warn \
                  | tee "$OUT/suite_peak.log" | tail -30;;
    module) echo "== module ($(left) s left)"
            timeout $(( $(left) - 5 )) python benchmarks/bench_moe.py --module --suite --configs "$MODULE_CONFIGS" 2>&1 \
              | grep -v -i warn | tee "$OUT/module.log" | tail -20;;
    profile) echo "== profile ($(left) s left)"
             for c in qwen3-30b-a3b mid-64e olmoe-1b-7b dsv3-ep8-slice mixtral-8x7b; do
               timeout 60 python benchmarks/profile_fast.py $c 2>&1 | grep -v -i warn
             done > "$OUT/profile.log"; grep -c "cutlass" "$OUT/profile.log";;
    ab-wait) echo "== ab-wait ($(left) s left)"; W="mok:qwen3-30b-a3b mok:mixtral-8x7b"
             for r in 1 2; do
               (cd .dev/bc7_tree && PYTHONPATH=$PWD timeout 60 python benchmarks/energy_probe.py $W --seconds 3 \
                 --cool 1.5 2>&1 | grep "^| mok" | sed "s/^/bc7babc $r /")
               timeout 60 python benchmarks/energy_probe.py $W --seconds 3 --cool 1.5 2>&1 | grep "^| mok" \
                 | sed "s/^/this $r /"
             done | tee "$OUT/ab_wait.log";;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in tests|energy|preset|suite|suite-peak|module|profile|ab-wait) date -u;; esac
done
