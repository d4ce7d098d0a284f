# Sourced by the device scripts, to build energy_probe.py workloads of mok (`+VAR=VALUE` suffixes: its environment).
# each "SUFFIX ..." SHAPE...: each shape as the rule runs it, then with each of the suffixes in turn.
each() { local suffixes=$1 s x; shift; for s in "$@"; do printf 'mok:%s ' "$s"
                                                      for x in $suffixes; do printf 'mok:%s%s ' "$s" "$x"; done; done; }
# pairs SUFFIX SHAPE...: each shape as the rule runs it, then with SUFFIX.
pairs() { each "$@"; }
