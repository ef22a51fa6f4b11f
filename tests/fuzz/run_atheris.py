"""Coverage-guided fuzzing of the sans-I/O transport with atheris (libFuzzer): `make fuzz`.

    python tests/fuzz/run_atheris.py target|host [libFuzzer flags] [corpus dirs]

The first byte of each input picks how the rest is cut into reads (so the fuzzer also
explores chunking); the rest is the byte stream a hostile host (target mode) or a
hostile controller (host mode) sends. An exception escaping the connection, an output
that is not a sequence of well-formed PDUs, or a TermReq that is not the last PDU is a
crash. The committed corpus under tests/fuzz/corpus/ holds seeds and what earlier runs
found interesting.
"""

from __future__ import annotations

import logging
import sys

import atheris

# Everything the fuzzed code imports must be imported (first) inside this block to be
# instrumented: the streams module pulls in the target connection.
with atheris.instrument_imports(include=["pynvmf"]):
    from pynvmf.spec import pdu as P
    from pynvmf.spec.opcodes import IoOpcode
    from pynvmf.tcp.host import HostCommand, HostConnection
    from tests.fuzz.streams import chunked, drive_target
    from tests.support.raw import parse_pdus


def _cuts(first: int, length: int) -> list[int]:
    step = first + 1
    return list(range(step, length, step))


def fuzz_target(data: bytes) -> None:
    if not data:
        return
    stream = data[1:]
    out, model = drive_target(chunked(stream, _cuts(data[0], len(stream))))
    conn = model.conn
    assert conn is not None
    pdus = parse_pdus(out, hdgst=conn.hdgst, ddgst=conn.ddgst)
    for i, pdu in enumerate(pdus):
        if pdu.type == P.PduType.C2H_TERM_REQ:
            assert i == len(pdus) - 1 and conn.closing


def fuzz_host(data: bytes) -> None:
    if len(data) < 2:
        return
    done: list[HostCommand] = []
    conn = HostConnection(
        16,
        done.append,
        lambda: None,
        header_digest=bool(data[1] & 1),
        data_digest=bool(data[1] & 2),
        max_transfer=65536,
    )
    conn.start()
    stream = data[2:]
    submitted = False
    for piece in chunked(stream, _cuts(data[0], len(stream))):
        if conn.closing:
            break
        conn.feed(piece)
        if conn.established and not submitted and not conn.closing:
            submitted = True
            conn.submit(IoOpcode.READ, 1, cdw12=7, into=memoryview(bytearray(4096)))
            conn.submit(IoOpcode.WRITE, 1, cdw12=31, data=bytes(16384))
    out = b"".join(bytes(b) for b in conn.take_output())
    pdus = parse_pdus(out, hdgst=conn.hdgst, ddgst=conn.ddgst)
    for i, pdu in enumerate(pdus):
        if pdu.type == P.PduType.H2C_TERM_REQ:
            assert i == len(pdus) - 1
    assert len({id(cmd) for cmd in done}) == len(done)


def main() -> None:
    logging.disable(logging.CRITICAL)  # every TermReq logs a warning: millions of lines
    mode = sys.argv.pop(1) if len(sys.argv) > 1 else "target"
    entry = {"target": fuzz_target, "host": fuzz_host}[mode]
    atheris.Setup(sys.argv, entry)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
