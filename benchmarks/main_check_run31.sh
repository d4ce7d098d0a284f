#!/usr/bin/env bash
# Run 31's device calls: gate and up as two tensors read as they are (the fused gate/up + SwiGLU launch and the
# d_x GEMM with operand b_up) against b71c01e (two tensors: the forward unfused, the backward concatenating).
# Steps, each logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   tests    python -m pytest tests/gpu (the whole GPU suite);
#   verify   mok verify --device cuda;
#   ab       bench_moe.py --suite (mok: two tensors, mok_gu: one [gate; up] tensor, the grouped_mm path) on the
#            AB_CONFIGS shapes, b71c01e's tree and library then this tree's, two rounds. Needs b71c01e's tree at
#            .dev/b71_tree (`mkdir -p .dev/b71_tree && git archive b71c01e mok benchmarks | tar -x -C .dev/b71_tree`)
#            and its library at $OLD_LIB (both carried);
#   suite    bench_moe.py --suite on every shape, this tree only;
#   tests-new  the GPU tests this run changed or added;
#   fwd-ab   bench_fused.py --forward (the fused gate/up + SwiGLU launch against the GEMM and the swiglu_fwd kernel
#            apart, interleaved, one process) on FWD_CONFIGS, the rule's tile and the cooperative one (variant 0);
#   h200     what run 31 could not measure on an H200 (refuses to run on another card): issue 13's preset
#            (energy_preset.log), the suite with both layouts (suite.log), then fwd-ab.
# Printing steps for the CPU check (tests/test_device_scripts.py): `ab-configs`, `fwd-configs`.
# Usage (repo root, a library built from this tree):
#   MOK_FAST_LIB=$PWD/.build/b31/libmok_fast.so OLD_LIB=$PWD/.build/new/libmok_fast.so bash benchmarks/main_check_run31.sh tests ab
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
AB_CONFIGS=mixtral-8x7b,gpt-oss-20b,qwen3-30b-a3b,gpt-oss-120b,dbrx,qwen1.5-moe-a2.7b
FWD_CONFIGS=dbrx,mixtral-8x7b,gpt-oss-20b,llama-4-scout
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
suite() {  # tree, library, label: bench_moe.py --suite on AB_CONFIGS
  (cd "$1" && PYTHONPATH=$PWD MOK_FAST_LIB=$2 timeout $(( $(left) < 150 ? $(left) : 150 )) python \
    benchmarks/bench_moe.py --suite --weight-grads bf16 --methods mok,mok_gu,grouped_mm --configs "$AB_CONFIGS" 2>&1 \
    | grep -v -i warn | sed "s/^/$3 /")
}
for step in "$@"; do
  case $step in
    ab-configs) echo $AB_CONFIGS;;
    fwd-configs) echo $FWD_CONFIGS;;
    tests-new) timeout $(( $(left) < 150 ? $(left) : 150 )) python -m pytest tests/gpu/test_fast_module.py \
                 tests/gpu/test_fast_dx_halves.py tests/gpu/test_fast_fused_fwd.py -q -p no:cacheprovider 2>&1 \
                 | tee "$OUT/gpu_tests_new.log" | tail -3;;
    fwd-ab) echo "== fwd-ab ($(left) s left)"
            for fv in "" 0; do
              timeout $(( $(left) < 200 ? $(left) : 200 )) python benchmarks/bench_fused.py --forward \
                --configs "$FWD_CONFIGS" --rounds 5 --reps 5 ${fv:+--fused-variant $fv} 2>&1 | grep -v -i warn
            done | tee "$OUT/fwd_ab.log";;
    tests) date -u; nvidia-smi --query-gpu=name --format=csv,noheader
           timeout $(( $(left) < ${TESTS_S:-240} ? $(left) : ${TESTS_S:-240} )) python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 \
             | tee "$OUT/gpu_tests.log" | tail -3;;
    verify) timeout $(( $(left) < 120 ? $(left) : 120 )) python -m mok.harness.cli verify --device cuda --no-progress 2>&1 \
              | tee "$OUT/verify.log" | tail -3;;
    ab) echo "== ab ($(left) s left)"
        for r in 1 2; do
          suite .dev/b71_tree "$OLD_LIB" "b71c01e r$r"
          suite "$PWD" "$MOK_FAST_LIB" "this r$r"
        done | tee "$OUT/ab.log" | grep -v "^.* r[12] *$" | tail -80;;
    h200) nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "h200: not an H200"; exit 3; }
          BUDGET_S=$(( $(left) / 3 )) bash benchmarks/main_check_run28.sh preset | tail -9
          BUDGET_S=$(left) bash "$0" suite fwd-ab;;
    suite) echo "== suite ($(left) s left)"
           timeout $(( $(left) - 5 )) python benchmarks/bench_moe.py --suite --weight-grads bf16 \
             --methods mok,mok_gu,grouped_mm 2>&1 | grep -v -i warn | tee "$OUT/suite.log" | tail -64;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in tests|verify|ab|suite|tests-new|fwd-ab) date -u;; esac
done
