"""The target transport's settings (a port's NVMe/TCP parameters) and an established
connection's state, in a module of their own: they are pickled to the worker processes,
and a frozen dataclass compiled by mypyc (pynvmf.tcp.target may be compiled:
docs/performance.md) does not unpickle."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TransportConfig:
    inline_data_size: int = 16384
    max_h2c_data: int = 128 * 1024
    # Digest policy: whether the target agrees to a host's request for each digest.
    allow_header_digest: bool = True
    allow_data_digest: bool = True
    cpda: int = 0


@dataclass(frozen=True, slots=True)
class EstablishedState:
    """An established connection's transport state, as plain data: what its ICReq and
    ICResp settled, and where its submission queue's head stands. Another
    TargetConnection continues the connection from it (TargetConnection.adopt: `pynvmf
    target --cores N` hands I/O queues to worker processes so)."""

    hpda: int
    hdgst: bool
    ddgst: bool
    maxr2t: int
    # SQHD as the next completion reports it (the commands consumed so far, modulo SQSIZE).
    sqhd: int = 0
