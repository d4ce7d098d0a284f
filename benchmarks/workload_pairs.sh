# Sourced by the device scripts. pairs SUFFIX SHAPE...: each shape as the rule runs it, then with SUFFIX
# (energy_probe.py's +VAR=VALUE), as energy_probe.py workloads.
pairs() { local suffix=$1 s; shift; for s in "$@"; do printf 'mok:%s mok:%s%s ' "$s" "$s" "$suffix"; done; }
