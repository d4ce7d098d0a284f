#!/usr/bin/env bash
# Packs SonicMoE and what it needs for the device machine (no package registry there) into one archive small enough
# to carry: .sonic/site.tar.xz (git ignores .sonic/). Run here, in the repository's root, where pip reaches PyPI.
#
#   bash benchmarks/sonic_wheels.sh                  # -> .sonic/site.tar.xz (about 55 MB; takes minutes: xz -9)
#
# On the device (carry .sonic): mkdir -p /tmp/site && tar -C /tmp/site -xJf .sonic/site.tar.xz &&
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages:$PYTHONPATH
#
# Versions: sonic-moe 0.1.2.post1 (the one issue 13 measured) pins nvidia-cutlass-dsl 4.4.2; quack-kernels 0.4.1 is
# the newest that accepts it (0.5.0 wants 4.5.2), so it is what pip resolves. The cu13 build of the DSL's libraries
# (the device's torch is +cu130) holds everything the base wheel does. torch, numpy, einops, cuda-bindings and
# triton are already there. The archive is xz, not the wheels: the DSL's library wheel alone is over the 64 MiB a
# device call carries. That limit counts the working tree too (about 5.5 MB): with the archive and its cache part, a
# mok library of 5.9 MB went over it in run 41; a copy made by `strip --strip-unneeded` (5.1 MB: CUTLASS's local
# symbols gone, the kernels and exported functions kept) passed the size check (that call then found no machine).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
pkgs=(sonic-moe==0.1.2.post1 quack-kernels==0.4.1 nvidia-cutlass-dsl-libs-cu13==4.4.2 apache-tvm-ffi==0.1.15.post2
      torch-c-dlpack-ext==0.1.5)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for p in "${pkgs[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/whl" "$p"
done
mkdir -p "$work/site" .sonic
for w in "$work"/whl/*.whl; do unzip -q -o "$w" -d "$work/site"; done
rm -rf "$work/site/tvm_ffi/3rdparty/libbacktrace"  # its C sources (built into libtvm_ffi.so): 0.45 MB of the carry
tar -C "$work/site" -cf - . | xz -9 -T4 > .sonic/site.tar.xz
ls -l .sonic/site.tar.xz
