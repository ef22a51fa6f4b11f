#!/bin/bash
# Alternate pynvmf source trees under spdk_nvme_perf and print, per run, the IOPS and the
# target's CPU time per I/O (utime + stime of the target process over 3 s of the run):
# on a shared machine the CPU per I/O varies less than the rate does.
#
#   benchmarks/target_cpu_ab.sh SPDK_BUILD REPEATS "PERF ARGS" TREE...
#   benchmarks/target_cpu_ab.sh /work/spdk/build 5 "-q 8 -o 131072 -w read" /tmp/a /tmp/b
#
# Each tree serves benchmarks/vs_spdk.py's namespace (--serve) with the target on CPU 0;
# spdk_nvme_perf runs on CPU 1 for 4 s.
set -euo pipefail
SPDK=$1; REPS=$2; PERF_ARGS=$3; shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-$HERE/../.venv/bin/python}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for r in $(seq "$REPS"); do
    for TREE in "$@"; do
        coproc T { PYTHONPATH=$TREE exec "$PY" "$HERE/vs_spdk.py" --serve --target-cpu 0; }
        read -r -u "${T[0]}" PORT NQN
        # shellcheck disable=SC2086
        "$SPDK/bin/spdk_nvme_perf" -c 0x2 $PERF_ARGS -t 4 \
            -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN" > "$OUT" 2>&1 &
        PERF=$!
        sleep 0.5  # into the run, past connect (a measurement window, not synchronisation)
        # The target is the serving process's busiest child (spawned by start_target).
        TPID=$(for p in $(pgrep -P "$T_PID"); do echo "$(ticks "$p") $p"; done | sort -n | tail -1 | cut -d' ' -f2)
        B=$(ticks "$TPID"); sleep 3; A=$(ticks "$TPID")
        wait "$PERF"
        IOPS=$(awk '/^Total/ {print $3}' "$OUT")
        echo "$r $TREE iops=$IOPS target_us_per_io=$(awk -v t=$((A - B)) -v i="$IOPS" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz * 1e6 / (i * 3)}')"
        exec {T[1]}>&-
        wait "$T_PID" || true
    done
done
