# Sourced by the device scripts that run SonicMoE (main_check_run40.sh, main_check_run44.sh): its packages from
# .sonic/site.tar.xz (bash benchmarks/sonic_wheels.sh) on PYTHONPATH, its kernel and autotuning caches under
# /tmp/sonic_cache (from .sonic/sonic_cache.tar.xz.part* when carried), and sonic_unpack, which puts them there
# (once; returns non-zero when there is no .sonic/site.tar.xz).
export PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages:${PYTHONPATH:-}
export QUACK_CACHE_DIR=/tmp/sonic_cache/quack CUTE_DSL_CACHE_DIR=/tmp/sonic_cache/cute QUACK_COMPILE_WORKERS=16
sonic_unpack() {
  [ -d /tmp/site/sonicmoe ] || { mkdir -p /tmp/site && tar -C /tmp/site -xJf .sonic/site.tar.xz; } || return 1
  if ls .sonic/sonic_cache.tar.xz.part* >/dev/null 2>&1 && [ ! -d /tmp/sonic_cache ]; then
    mkdir -p /tmp/sonic_cache && cat .sonic/sonic_cache.tar.xz.part* | tar -C /tmp/sonic_cache -xJ
  fi
  mkdir -p "$QUACK_CACHE_DIR" "$CUTE_DSL_CACHE_DIR"
}
