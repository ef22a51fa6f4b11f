"""What one DH-HMAC-CHAP transaction costs each side, per DH group: the controller's and
the host's state machines driven against each other in memory (no socket), SHA-256,
bidirectional; median milliseconds of CPU per side over N transactions.

    python benchmarks/auth_cost.py [--runs 15]

The controller's share is what a target spends per queue a host authenticates (the
Challenge's key pair and the exchange dominate); the host's, what a connect costs it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pynvmf.auth import ControllerAuth, DhchapKey, HostAuth, HostAuthConfig
from pynvmf.spec.auth import DhGroupId, HashId

NQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000be"
SUBNQN = "nqn.2024-11.dev.pynvmf:bench"


def one(group: DhGroupId, key: DhchapKey, ctrl_key: DhchapKey) -> tuple[float, float]:
    config = HostAuthConfig(key, ctrl_key, (HashId.SHA256,), (group,))
    ctrl = ControllerAuth(lambda: config, NQN, SUBNQN, 0)
    host = HostAuth(key, NQN, SUBNQN, ctrl_key=ctrl_key)
    c = h = 0.0
    t = time.process_time()
    negotiate = host.negotiate()
    h += time.process_time() - t
    t = time.process_time()
    ctrl.send(negotiate)
    challenge = ctrl.receive()
    c += time.process_time() - t
    t = time.process_time()
    reply = host.reply(challenge)
    h += time.process_time() - t
    t = time.process_time()
    ctrl.send(reply)
    success1 = ctrl.receive()
    c += time.process_time() - t
    t = time.process_time()
    success2 = host.success1(success1)
    h += time.process_time() - t
    assert success2 is not None
    t = time.process_time()
    ctrl.send(success2)
    c += time.process_time() - t
    assert ctrl.authenticated
    return c * 1000, h * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    key, ctrl_key = DhchapKey.generate(32), DhchapKey.generate(32)
    print("| DH group | controller ms | host ms |")
    print("|---|---|---|")
    for group in DhGroupId:
        one(group, key, ctrl_key)  # warm: the group's parameters are built once
        samples = [one(group, key, ctrl_key) for _ in range(args.runs)]
        c = statistics.median(s[0] for s in samples)
        h = statistics.median(s[1] for s in samples)
        print(f"| {group.text} | {c:.2f} | {h:.2f} |")


if __name__ == "__main__":
    main()
