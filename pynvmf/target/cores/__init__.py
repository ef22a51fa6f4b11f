"""`pynvmf target --cores N`: the main process's side (workers.py), the worker
process (worker.py), the channel between them (ipc.py), the records of the target's
state they exchange (shared_state.py) and the ANA statuses they share in memory
(ana_table.py)."""
