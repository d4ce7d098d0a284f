#!/usr/bin/env bash
# One device call: GPU tests, kernel profile, benchmark, and (optionally) the torch build; logs go
# under $OUT. Run from the repo root. A carried prebuilt library (.build/libmok_fast.so, built here
# with `python -m mok.fast._build .build/libmok_fast.so`) is used when present; the `build` step
# then checks the normal first-use build (torch.utils.cpp_extension.load) and loads that one.
# Usage: bash benchmarks/device_run.sh [tests] [profile] [bench] [build]
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f .build/libmok_fast.so ] && export MOK_FAST_LIB=$PWD/.build/libmok_fast.so
for step in "$@"; do
  case $step in
    tests) timeout 150 python -m pytest tests/gpu -q -rA -p no:cacheprovider --timeout 120 2>&1 | tee "$OUT/gpu_fast.log" | tail -3;;
    profile) timeout 60 python benchmarks/profile_fast.py 2>&1 | grep -v -i warn > "$OUT/profile.log";;
    bench) timeout 200 python benchmarks/bench_moe.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -14;;
    build) if ! python -c "import cutlass_library" 2>/dev/null; then
             python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
           fi
           unset MOK_FAST_LIB; export MOK_FAST_CACHE=/tmp/mokcache
           (time timeout 300 python -c "import mok.fast._build as b; print(b.build_with_torch())") 2>&1 | tail -5 | tee "$OUT/build.log"
           timeout 60 python benchmarks/smoke_fast.py 2>&1 | tail -2 | tee -a "$OUT/build.log";;
  esac
done
