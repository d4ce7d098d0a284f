#!/usr/bin/env bash
# CPU and wall seconds to compile each translation unit of the fast path (mok/fast/csrc/*.cu), one at a
# time, with the flags of mok's own build (mok.fast._build.compile_flags(), -c only). CPU seconds
# (user, nvcc and its children) are the figure that compares across loaded machines.
# Usage, from the repo root (a CPU machine is enough: nvcc and the nvidia-cutlass package):
#   bash benchmarks/build_cost.sh
set -euo pipefail
PY=${PYTHON:-python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
NVCC=$($PY -c "from mok.fast import _build; print(_build.find_nvcc())")
read -r -a FLAGS <<< "$($PY -c "from mok.fast import _build; print(' '.join(_build.compile_flags()))")"
echo "nvcc: $($NVCC --version | tail -1); $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-20s %8s %8s\n' "translation unit" "cpu s" "wall s"
for src in mok/fast/csrc/*.cu; do
  /usr/bin/time -f "%U %e" -o "$W/time" "$NVCC" "${FLAGS[@]}" -Xcompiler -fPIC -c "$src" -o "$W/out.o"
  read -r user wall < "$W/time"
  printf '%-20s %8s %8s\n' "$(basename "$src")" "$user" "$wall"
done
