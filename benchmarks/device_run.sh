#!/usr/bin/env bash
# One device call: GPU tests, `mok verify --device cuda`, module and layer benchmarks, the GPU training
# example, kernel profile; logs go under $OUT. Run from the repo root. A carried prebuilt library
# (.build/libmok_fast.so, built here with `python -m mok.fast._build .build/libmok_fast.so`) is used
# when present; the `build` step checks the normal first-use build (cpp_extension) instead.
# Usage: bash benchmarks/device_run.sh [tests] [ep] [bench_ep] [verify] [module] [bench] [suite] [msuite] [train] [hf] [pmodule] [profile] [build] [variants] [cast]
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f .build/libmok_fast.so ] && export MOK_FAST_LIB=$PWD/.build/libmok_fast.so
for step in "$@"; do
  case $step in
    tests) timeout 420 python -m pytest tests/gpu -q -rfE -p no:cacheprovider --timeout 300 2>&1 | tee "$OUT/gpu_tests.log" | tail -15;;
    ep) timeout 90 python -m pytest tests/gpu/test_fast_ep_kernels.py -q -rfE -p no:cacheprovider --timeout 60 2>&1 | tee "$OUT/gpu_ep_kernels.log" | tail -5
        timeout ${EP_TESTS_S:-420} python -m pytest tests/gpu/test_fast_ep.py -q -rfE -p no:cacheprovider --timeout 120 --durations=6 2>&1 | tee "$OUT/gpu_ep.log" | tail -25
        timeout 240 python -m mok.harness.cli diff-grads --device cuda --impl fast --seeds 0 1 --world-sizes 1 2 4 --no-progress 2>&1 | tee "$OUT/diff_grads_fast_ep.log" | tail -14;;
    bench_ep) for w in 2 4; do timeout 200 python benchmarks/bench_ep.py --world-size $w --config mid-64e; done 2>&1 | grep -v -i warn | tee "$OUT/bench_ep.log";;
    verify) timeout 120 python -m mok.harness.cli verify --device cuda --no-progress 2>&1 | tee "$OUT/verify_cuda.log" | tail -4;;
    module) timeout 240 python benchmarks/bench_moe.py --module --json /tmp/module.json 2>&1 | tee "$OUT/module.log" | tail -16;;
    suite) for g in bf16 fp32; do
             timeout 200 python benchmarks/bench_moe.py --suite --weight-grads $g 2>&1 | tee "$OUT/suite_${g}_weight_grads.log" | tail -24
           done;;
    msuite) timeout 240 python benchmarks/bench_moe.py --module --suite 2>&1 | tee "$OUT/module_suite.log" | tail -14;;
    bench) timeout 240 python benchmarks/bench_moe.py --methods mok,grouped_mm --routings random --json /tmp/bench.json 2>&1 | tee "$OUT/bench.log" | tail -9;;
    hf) for impl in "mok --prove" "grouped_mm"; do
          timeout 240 python examples/train_hf_moe.py --device cuda --steps 50 --experts-implementation $impl 2>&1 | grep -v "^step" | tail -6
        done 2>&1 | tee "$OUT/hf.log";;
    train) timeout 240 python examples/train_tiny_moe.py --device cuda --prove --out /tmp/train 2>&1 | tail -12 | tee "$OUT/train.log"; cp /tmp/train/loss_curve.png "$OUT/train_loss_curve.png";;
    pmodule) timeout 120 python benchmarks/profile_module.py ${PROFILE_CONFIG:-qwen3-30b-a3b} 2>&1 | grep -v -i warn > "$OUT/profile_module.log"; head -8 "$OUT/profile_module.log"; grep "GPU busy" "$OUT/profile_module.log";;
    variants) for V in ${VARIANTS:-0 1 2}; do MOK_FAST_GEMM_VARIANT=$V timeout 120 python benchmarks/variant_bits.py --save /tmp/v$V.pt; done
              python benchmarks/variant_bits.py --compare $(for V in ${VARIANTS:-0 1 2}; do echo /tmp/v$V.pt; done) 2>&1 | tee "$OUT/variant_bits.log"
              for V in ${VARIANTS:-0 1 2}; do echo "== MOK_FAST_GEMM_VARIANT=$V"
                MOK_FAST_GEMM_VARIANT=$V timeout 150 python benchmarks/bench_moe.py --methods mok_gu${V_PEERS:-} --routings random 2>&1 | grep -E "^  |peak \(|CHECK"
                MOK_FAST_GEMM_VARIANT=$V timeout 100 python benchmarks/bench_moe.py --suite --configs ${V_SUITE:-mixtral-8x7b} --methods mok_gu${V_PEERS:-} 2>&1 | grep -E "^  |CHECK"
              done 2>&1 | tee "$OUT/variants_bench.log";;
    cast) timeout 60 python benchmarks/bench_gate_up_cast.py 2>&1 | tee "$OUT/gate_up_cast.log";;
    profile) timeout 90 python benchmarks/profile_fast.py 2>&1 | grep -v -i warn > "$OUT/profile.log";;
    build) if ! python -c "import cutlass_library" 2>/dev/null; then
             python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
           fi
           unset MOK_FAST_LIB; export MOK_FAST_CACHE=/tmp/mokcache
           (time timeout 300 python -c "import mok.fast._build as b; print(b.build_with_torch())") 2>&1 | tail -5 | tee "$OUT/build.log"
           timeout 60 python benchmarks/smoke_fast.py 2>&1 | tail -2 | tee -a "$OUT/build.log";;
  esac
done
