#!/usr/bin/env bash
# The device calls planned in run 32 (a session with no device: benchmarks/RESULTS.md run 32). Steps, each logged
# under $OUT, each given what is left of BUDGET_S (seconds, default 560):
#   tests     python -m pytest tests/gpu (run 31's review commit, cffb7d4, has not run on a GPU);
#   verify    mok verify --device cuda;
#   h200      main_check_run31.sh's h200 step: issue 13's preset, the suite with both layouts, the fused forward's
#             tiles (refuses to run on another card);
#   stages    what fewer mainloop stages cost the row-tiled GEMMs' full tiles, the price every tile would pay for a
#             tile pairing two experts' short last tiles (docs/fast_path_measurements.md): profile_fast.py on STAGE_CONFIGS under
#             $MOK_FAST_LIB and under $STAGES_LIB (benchmarks/stages_probe.sh: the same kernels with the stages left
#             once each stage holds a second B tile, 5 -> 3 and d_a's 4 -> 2), one process each, two rounds
#             alternating; then whole steps of the same shapes (energy_probe.py, STAGE_WORKLOADS: burst and steady)
#             under each, same order;
#   dx-stages the d_x (and down) GEMMs with fewer mainloop stages than the carve-out gives (the stages step found d_x
#             faster at 3): profile_fast.py's down and d_x lines on STAGE_CONFIGS and whole steps (energy_probe.py,
#             DX_WORKLOADS, two rounds) under each of DX_LIBS, the baseline first (stages_probe.diff with
#             -DMOK_PROBE_STAGES=N on one or two translation units); run `tests` under a candidate library first;
#   da-v2     mid-64e's fused d_a launch in 2x1 clusters (tile variant 2; 3% faster alone in run 30) against the
#             rule's variant 3, whole steps interleaved (energy_probe.py, DA_WORKLOADS).
# Printing steps for the CPU check (tests/test_device_scripts.py): `stage-configs`, `stage-workloads`, `dx-workloads`,
# `da-workloads`.
# Usage (repo root, a library built from this tree and the probe built from it, both carried):
#   MOK_FAST_LIB=$PWD/.build/b32/libmok_fast.so STAGES_LIB=$PWD/.build/stages/libmok_fast.so \
#     bash benchmarks/main_check_run32.sh tests verify stages
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGE_CONFIGS=qwen3-30b-a3b,mid-64e,olmoe-1b-7b
STAGE_WORKLOADS="mok:qwen3-30b-a3b mok:mid-64e@S0 mok:olmoe-1b-7b"
DX_WORKLOADS="mok:qwen3-30b-a3b mok:mid-64e@S0 mok:olmoe-1b-7b mok:dsv3-ep8-slice@S0 mok:mixtral-8x7b"
DA_WORKLOADS="mok:mid-64e@S0 mok:mid-64e@S0+MOK_FAST_GEMM_VARIANT=,,,,,,2,,"
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
cap() { echo $(( $(left) < $1 ? $(left) : $1 )); }  # seconds for a step: at most $1, at most what is left
profiles() {  # rounds, configs, libraries...: profile_fast.py under each library in turn, one process each
  local rounds=$1 configs=$2; shift 2
  for r in $(seq "$rounds"); do
    for lib in "$@"; do
      echo "## round $r, library $lib"
      MOK_FAST_LIB=$lib timeout $(cap 90) python benchmarks/profile_fast.py "$configs" 2>&1 | grep -v -i warn
    done
  done
}
steps() {  # rounds, workloads, libraries...: energy_probe.py's whole steps under each library in turn
  local rounds=$1 workloads=$2; shift 2
  for r in $(seq "$rounds"); do
    for lib in "$@"; do
      echo "## round $r, library $lib"
      MOK_FAST_LIB=$lib timeout $(cap 90) python benchmarks/energy_probe.py $workloads --seconds 2 --cool 1 2>&1 \
        | grep -E "^\| mok|^\| workload"
    done
  done
}
for step in "$@"; do
  case $step in
    stage-configs) echo $STAGE_CONFIGS;;
    stage-workloads) echo $STAGE_WORKLOADS;;
    dx-workloads) echo $DX_WORKLOADS;;
    da-workloads) echo $DA_WORKLOADS;;
    tests) date -u; nvidia-smi --query-gpu=name --format=csv,noheader
           timeout $(cap ${TESTS_S:-240}) python -m pytest tests/gpu -q -p no:cacheprovider 2>&1 \
             | tee "$OUT/gpu_tests.log" | tail -3;;
    verify) timeout $(cap 120) python -m mok.harness.cli verify --device cuda --no-progress 2>&1 \
              | tee "$OUT/verify.log" | tail -3;;
    h200) BUDGET_S=$(left) bash benchmarks/main_check_run31.sh h200;;
    stages) echo "== stages ($(left) s left)"
            profiles 2 "$STAGE_CONFIGS" "$MOK_FAST_LIB" "$STAGES_LIB" > "$OUT/stages_profile.log"
            grep -E "^## |^== |cutlass|wall" "$OUT/stages_profile.log" | head -80
            steps 2 "$STAGE_WORKLOADS" "$MOK_FAST_LIB" "$STAGES_LIB" | tee "$OUT/stages_energy.log";;
    dx-stages) echo "== dx-stages ($(left) s left)"
               profiles 1 "$STAGE_CONFIGS" $DX_LIBS | grep -E "^## |^[a-z0-9.-]+: wall|down:|d_x:" \
                 | tee "$OUT/dx_stages_profile.log"
               steps 2 "$DX_WORKLOADS" $DX_LIBS | tee "$OUT/dx_stages_energy.log";;
    da-v2) echo "== da-v2 ($(left) s left)"
           timeout $(cap 150) python benchmarks/energy_probe.py $DA_WORKLOADS --seconds 3 --cool 1.5 --rounds 2 2>&1 \
             | grep -v -i warn | tee "$OUT/energy_da_v2.log" | tail -6;;
    *) echo "unknown step $step"; exit 2;;
  esac
  case $step in tests|verify|stages|dx-stages|da-v2) date -u;; esac
done
