"""What more than one test folder (and the benchmarks) imports: raw NVMe/TCP PDUs and
queues, the QEMU guest peers, free ports, `pynvmf target` as a process, the Ceph test
cluster. A helper one folder alone uses stays in that folder."""
