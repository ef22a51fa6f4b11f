#!/bin/bash
# SPDK v25.09's initiator (spdk_nvme_perf) against pynvmf's fault rules: what SPDK's
# host does with wrong data digests, Namespace Not Ready, and a Read held 2 s. One target,
# rules added and removed over the RPC between 3-second runs (docs/faults.md). As root
# (hugepages), from anywhere:
#   SPDK_BIN=$SPDK_DIR/build/bin contrib/spdk/fault-check.sh
set -u
B=${SPDK_BIN:?set SPDK_BIN to the folder of spdk_nvme_perf (SPDK v25.09 build/bin)}
P=${PYNVMF:-.venv/bin/pynvmf}
S=/tmp/pf.sock
NQN=nqn.2024-11.dev.pynvmf:default
mkdir -p /dev/hugepages
mountpoint -q /dev/hugepages || mount -t hugetlbfs nodev /dev/hugepages
echo 512 > /proc/sys/vm/nr_hugepages
cd "$(dirname "$0")/../.."
$P target --listen 127.0.0.1:4470 --discovery-port 0 --memory 64M --rpc-socket $S > /tmp/pf-target.log 2>&1 &
T=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.2; done
R="$P rpc --server $S"
perf() { timeout 60 $B/spdk_nvme_perf -c 0x2 -q 8 -o 4096 -w randread -t 3 "$@" \
  -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4470 subnqn:$NQN" 2>&1 | grep -v "^$" | tail -8; }
echo "== baseline, digests"; perf -H -I
echo "== data digest wrong on 1% of reads (seed 3)"
$R pynvmf_fault_add action=corrupt_digest digest=data opcode=read probability:=0.01 seed:=3
perf -H -I
$R pynvmf_fault_list; $R pynvmf_fault_remove id:=1
echo "== Namespace Not Ready (no CRD) for 5 reads after the first 1000"
$R pynvmf_fault_add action=not_ready nsid:=1 after:=1000 limit:=5
perf
$R pynvmf_fault_list; $R pynvmf_fault_remove id:=2
echo "== one read held 2 s"
$R pynvmf_fault_add action=delay delay_ms:=2000 opcode=read after:=1000 limit:=1
perf
$R pynvmf_fault_list
kill $T; wait $T
grep -i "fault rule" /tmp/pf-target.log | head -5
