# Sourced by the device scripts (main_check_run41.sh and later): one device call's time budget, and the whole-step
# timing step every script runs. BUDGET_S: the seconds all the steps of the call may take (default 560), counted from
# when this file is sourced; each step gets the smaller of its own limit and what is left.
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
# cap LIMIT [MARGIN]: the smaller of LIMIT seconds and what is left less MARGIN (default 0)
cap() { local l; l=$(( $(left) - ${2:-0} )); echo $(( l < $1 ? l : $1 )); }
# energy LOG LINES LIMIT ARGS...: energy_probe.py ARGS (2 s steady, 1 s cool; ARGS say --rounds) within LIMIT seconds
# and what is left less 5, appended to $OUT/LOG, its last LINES lines shown
energy() { local log=$1 lines=$2 limit=$3; shift 3
           timeout "$(cap "$limit" 5)" python benchmarks/energy_probe.py "$@" --seconds 2 --cool 1 2>&1 \
             | grep -v -i warn | tee -a "$OUT/$log" | tail -"$lines"; }
# lib NAME: the path in $MOK_FAST_LIB_<NAME> (A, B, C: the libraries a script compares)
lib() { local var=MOK_FAST_LIB_$1; echo "${!var}"; }
# ab_round ROUND LIB: one energy_probe.py process, one round of $AB_WORKLOADS under library $MOK_FAST_LIB_<LIB> (A, B,
# ...), appended to $OUT/energy_ab.log: the scripts that compare libraries process by process
ab_round() { echo "-- round $1, library $2" | tee -a "$OUT/energy_ab.log"
             MOK_FAST_LIB=$(lib "$2") energy energy_ab.log 8 90 $AB_WORKLOADS --rounds 1; }
# ab_rounds N: N rounds of ab_round, library A then B in each
ab_rounds() { local r l; for r in $(seq 1 "$1"); do for l in A B; do ab_round "$r" "$l"; done; done; }
# group_changes LIB...: benchmarks/bench_group_changes.py on $GROUP_CONFIGS in variants 0, 3 and 5, under each library
# in turn ($OUT/groups_<LIB>.log)
group_changes() { local l; for l in "$@"; do echo "-- library $l"
                    MOK_FAST_LIB=$(lib "$l") timeout "$(cap 120)" python benchmarks/bench_group_changes.py \
                      --configs "$GROUP_CONFIGS" --variants 0,3,5 --rounds 2 2>&1 | tee "$OUT/groups_$l.log" | tail -16
                  done; }
# bits_against_a LOG RUN...: variant_bits.py under library A by the rule (once a call: /tmp/bits_A_vrule.pt), then
# each RUN, LIB:VARIANT (VARIANT empty: the rule) under $MOK_FAST_LIB_<LIB>, all compared bit for bit with A ($OUT/LOG)
bits_against_a() { local log=$1 r l v; shift
  [ -f /tmp/bits_A_vrule.pt ] || MOK_FAST_LIB=$(lib A) timeout "$(cap 60)" python benchmarks/variant_bits.py \
    --save /tmp/bits_A_vrule.pt 2>&1 | grep -v -i warn
  for r in "$@"; do l=${r%%:*} v=${r#*:}
    MOK_FAST_LIB=$(lib "$l") MOK_FAST_GEMM_VARIANT=$v timeout "$(cap 60)" python benchmarks/variant_bits.py \
      --save "/tmp/bits_${l}_v${v:-rule}.pt" 2>&1 | grep -v -i warn
  done
  python benchmarks/variant_bits.py --compare /tmp/bits_A_vrule.pt $(for r in "$@"; do v=${r#*:}
    echo "/tmp/bits_${r%%:*}_v${v:-rule}.pt"; done) 2>&1 | tee "$OUT/$log" | tail -$(( $# + 2 )); }
