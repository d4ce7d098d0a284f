#!/usr/bin/env bash
# Run 40's device calls: SonicMoE measured beside mok, same card, same inputs (benchmarks/sonic_peer.py). Steps, each
# logged under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   sonic-check  bench_moe.py on issue 13's four shapes without shared experts: mok (gate and up as one tensor),
#                SonicMoE and the grouped_mm path, bf16 weight gradients; each method's y and d_x checked against the
#                fp32 oracle before it is timed. SonicMoE's kernels compile (and autotune) on their first call here;
#   sonic-warm   sonic_check.py on the four shapes: SonicMoE's first call on each (compile, autotune; the seconds it
#                took) and its y and d_x against the fp32 oracle, without timing mok or the grouped_mm path;
#   sonic-side   energy_probe.py --preset issue13-sonic in two interleaved rounds: issue 13's targets, then mok's burst
#                time against SonicMoE's measured in the same call;
#   sonic-profile profile_peers.py on the four shapes: each kernel of one mok step and one SonicMoE step, in launch
#                order (torch.profiler), where the two spend their time;
#   sonic-cache  SonicMoE's compiled kernels and autotuning results (QUACK_CACHE_DIR, CUTE_DSL_CACHE_DIR under
#                /tmp/sonic_cache), packed into $OUT as sonic_cache.tar.xz.partNN (15 MiB each) for a later call to
#                carry as .sonic/ (cat .sonic/sonic_cache.tar.xz.part* | tar -xJ, done here when they are there);
#   tall-ab      with a library built from main + benchmarks/tall_tile_run40.diff (tile variant 5: cooperative 256x128
#                in 1x2 clusters, the down and d_x GEMMs' tile SonicMoE's autotuner picks; built in run 40, not yet
#                run): the GPU tests of every tile variant against variant 0 bit for bit, then whole steps
#                (energy_probe.py, two interleaved rounds) of issue 13's four shapes by the rule and with the down
#                and d_x kinds forced to variant 5;
#   suite-new    run 39's step: bench_moe.py --suite on the four shapes suite.json gained in run 39 (on any card).
# The sonic-* steps need .sonic/site.tar.xz (bash benchmarks/sonic_wheels.sh) carried; it is unpacked into /tmp/site
# once.
# Printing steps for the CPU checks (tests/test_device_scripts.py): sonic-shapes, tall-workloads.
# Usage (repo root, a build carried):
#   MOK_FAST_LIB=$PWD/.build/<main + tall_tile_run40.diff>/libmok_fast.so BUDGET_S=300 \
#     bash benchmarks/main_check_run40.sh tall-ab
#   MOK_FAST_LIB=$PWD/.build/b39main/libmok_fast.so BUDGET_S=580 bash benchmarks/main_check_run40.sh sonic-check \
#     sonic-side sonic-cache
#   BUDGET_S=580 bash benchmarks/main_check_run40.sh sonic-warm sonic-cache   (then sonic-side, the cache carried)
export PYTHONUNBUFFERED=1
source "$(dirname "$0")/sonic_env.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SONIC_SHAPES=qwen3-30b-a3b,mid-64e,dsv3-ep8-slice  # configs.json's; mixtral-8x7b is suite.json's
source "$(dirname "$0")/workload_pairs.sh"
DOWN_DX_TALL=,5,,5,,,,,  # MOK_FAST_GEMM_VARIANT: the down (TN_BF16) and d_x (NN_BF16) kinds in variant 5
TALL_WORKLOADS=$(pairs +MOK_FAST_GEMM_VARIANT=$DOWN_DX_TALL qwen3-30b-a3b mid-64e@S0 dsv3-ep8-slice@S0 mixtral-8x7b)
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
for step in "$@"; do
  case $step in
    sonic-check) echo "== sonic-check ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
                 sonic_unpack || { echo "sonic-check: no .sonic/site.tar.xz to unpack"; exit 1; }
                 python -c "import sonicmoe, quack, cutlass; from importlib.metadata import version as v; \
print(*(f'{p} {v(p)}' for p in ('sonic-moe', 'quack-kernels', 'nvidia-cutlass-dsl-libs-cu13', 'torch')))" 2>&1 | tail -3
                 for args in "--configs $SONIC_SHAPES --routings random" "--suite --configs mixtral-8x7b"; do
                   timeout $(( $(left) < 300 ? $(left) : 300 )) python benchmarks/bench_moe.py $args --no-shared \
                     --weight-grads bf16 --methods mok_gu,sonic,grouped_mm 2>&1 | grep -v -i warn \
                     | tee -a "$OUT/sonic_check.log" | grep -E "^  |CHECK|Error|error" | head -20
                 done;;
    sonic-warm) echo "== sonic-warm ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader; sonic_unpack
                timeout $(( $(left) - 40 < 380 ? $(left) - 40 : 380 )) python benchmarks/sonic_check.py \
                  $SONIC_SHAPES,mixtral-8x7b 2>&1 | grep --line-buffered -v -i warn | tee "$OUT/sonic_warm.log" | tail -10;;
    sonic-side) echo "== sonic-side ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader; sonic_unpack
                timeout $(( $(left) - 20 )) python benchmarks/energy_probe.py --preset issue13-sonic --rounds 2 \
                  --seconds 2 --cool 1 2>&1 | grep -v -i warn | tee "$OUT/energy_sonic.log" | tail -24;;
    sonic-profile) echo "== sonic-profile ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader; sonic_unpack
                   timeout $(( $(left) < 200 ? $(left) : 200 )) python benchmarks/profile_peers.py \
                     $SONIC_SHAPES,mixtral-8x7b 2>&1 | grep -v -i warn > "$OUT/profile_peers.log"
                   grep -E "kernels," "$OUT/profile_peers.log";;
    sonic-cache) echo "== sonic-cache"; du -sh /tmp/sonic_cache 2>/dev/null
                 tar -C /tmp/sonic_cache -cf - . | xz -6 -T8 | split -b 15M -d - "$OUT/sonic_cache.tar.xz.part"
                 ls -l "$OUT"/sonic_cache.tar.xz.part*;;
    tall-ab) echo "== tall-ab ($(left) s left)"; nvidia-smi --query-gpu=name --format=csv,noheader
             timeout $(( $(left) < 100 ? $(left) : 100 )) python -m pytest -q -p no:cacheprovider \
               tests/gpu/test_fast_tiles.py tests/gpu/test_fast_dx_halves.py 2>&1 | tee "$OUT/gpu_tiles.log" | tail -3
             timeout $(( $(left) - 5 )) python benchmarks/energy_probe.py $TALL_WORKLOADS --rounds 2 --seconds 2 \
               --cool 1 2>&1 | grep -v -i warn | tee "$OUT/energy_tall.log" | tail -12;;
    suite-new) BUDGET_S=$(left) bash benchmarks/main_check_run39.sh suite-new;;
    sonic-shapes) echo $SONIC_SHAPES;;
    tall-workloads) echo $TALL_WORKLOADS;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in sonic-shapes|tall-workloads) ;; *) date -u;; esac
done
