#!/usr/bin/env bash
# Rebuilds run 30's probe libraries of the d_a GEMM's SwiGLU-backward epilogue (benchmarks/RESULTS.md run 30): dd344a2's
# csrc with benchmarks/epi_probes_run30.diff applied, one translation unit (gemm_nn_swiglu_bwd.cu) compiled with the
# library's flags and linked with the other objects of a build of dd344a2's csrc:
#   NOLOAD   the old (consumer-copied) epilogue with its [p | q] copies zero-filled, not read: wrong results, a timing;
#   NOSTORE  the old epilogue with its stores skipped unless the output is an unlikely value: a timing;
#   V4       the new epilogue (the epilogue load warp copies [p | q]) as tile variant 4 of the kind, the old one in
#            variant 3: MOK_FAST_GEMM_VARIANT=,,,,,,4,, picks the new one at run time.
# Run 30 built NOLOAD and NOSTORE before V4's variant existed: their variant 4 was variant 3's code, here it is the new
# epilogue. The rule runs variant 3, which is the same in both, and so were the timings of run 30.
# Needs nvcc and the CUTLASS headers (pip install nvidia-cutlass). Usage, from the repo root:
#   git archive dd344a2 | tar -x -C /tmp/dd3 && (cd /tmp/dd3 && python -m mok.fast._build /tmp/dd3/lib/libmok_fast.so)
#   bash benchmarks/epi_probes_run30.sh /tmp/dd3/lib/libmok_fast_obj .build/probes   # -> .build/probes/<NAME>/libmok_fast.so
set -euo pipefail
base_obj=$(realpath "$1"); out=$(realpath -m "$2"); repo=$PWD
src=$(mktemp -d); trap 'rm -rf "$src"' EXIT
git archive dd344a2 mok/fast/csrc | tar -x -C "$src"
(cd "$src" && patch -p1 -s < "$repo/benchmarks/epi_probes_run30.diff")
flags=$(python -c "from mok.fast import _build; print(' '.join(f for f in _build.compile_flags() if f != '-I' + str(_build.CSRC)))")
others=$(ls "$base_obj"/*.o | grep -v '/gemm_nn_swiglu_bwd\.o$')
for probe in NOLOAD:-DMOK_EXP_NOLOAD NOSTORE:-DMOK_EXP_NOSTORE V4:; do
  name=${probe%%:*}; def=${probe#*:}
  mkdir -p "$out/$name"
  nvcc $flags -I"$src/mok/fast/csrc" $def -Xcompiler -fPIC -c "$src/mok/fast/csrc/gemm_nn_swiglu_bwd.cu" -o "$out/$name/probe.o"
  nvcc -gencode=arch=compute_90a,code=sm_90a -shared -cudart static $others "$out/$name/probe.o" -o "$out/$name/libmok_fast.so"
  echo "$out/$name/libmok_fast.so"
done
