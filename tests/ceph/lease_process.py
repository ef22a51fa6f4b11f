"""A lease holder in a process of its own, for tests/ceph/test_lease.py.

Runs a LeaseManager (pynvmf.ha.lease) and prints one JSON line per event, with
time.monotonic() (CLOCK_MONOTONIC: one clock for every process of the machine, so
two holders' lines compare): {"event": "start", "address": ...}, {"event": "owned" |
"lost", "group": G, "t": T}. With --image, it writes to block 0 of that RBD image,
through the same RADOS client, for as long as it owns its first group (as a gateway serves
I/O), and prints {"event": "write", "seq": N, "t": T} for each completed write and
{"event": "write_failed", "errno": E, "t": T} for a failed one.
--delay-renewals-after N makes renewal N and later take --delay seconds in the RADOS
thread (a slow network or OSD), while the process itself runs on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from pynvmf.block.rbd import ClusterSpec, RbdDevice
from pynvmf.ha.lease import LeaseConfig, LeaseManager


def emit(**event: Any) -> None:
    event.setdefault("t", time.monotonic())
    print(json.dumps(event), flush=True)


class DelayedLeases(LeaseManager):
    delay_after = 0
    delay = 0.0
    renewals = 0

    def _renew_hook(self, call: Any) -> Any:
        self.renewals += 1
        if not self.delay_after or self.renewals < self.delay_after:
            return call

        def slow() -> Any:
            time.sleep(self.delay)
            return call()

        return slow


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--conf", required=True)
    p.add_argument("--pool", default="rbd")
    p.add_argument("--gateway", required=True)
    p.add_argument("--groups", default="1")
    p.add_argument("--preferred", default="")
    p.add_argument("--lease", type=int, default=3)
    p.add_argument("--no-failback", action="store_true")
    p.add_argument("--image")
    p.add_argument("--delay-renewals-after", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--call-timeout", type=float, default=0.0)
    args = p.parse_args()
    spec = ClusterSpec.of(args.conf)
    owned = asyncio.Event()
    groups = [int(g) for g in args.groups.split(",")]

    def on_change(group: int, is_owned: bool) -> None:
        emit(event="owned" if is_owned else "lost", group=group)
        if group == groups[0]:
            (owned.set if is_owned else owned.clear)()

    mgr = DelayedLeases(
        spec,
        args.pool,
        args.gateway,
        groups,
        on_change,
        preferred=[int(g) for g in args.preferred.split(",") if g],
        config=LeaseConfig(
            lease_seconds=args.lease,
            failback=not args.no_failback,
            call_timeout=args.call_timeout,
        ),
    )
    mgr.delay_after = args.delay_renewals_after
    mgr.delay = args.delay
    device = None
    if args.image:
        # Opened before the manager: the same ClusterSpec shares one RADOS client.
        device = await RbdDevice.open_async(args.pool, args.image, conf=args.conf, io_timeout=60)
    await mgr.start()
    emit(event="start", address=mgr.address, gateway=args.gateway)
    if device is None:
        await asyncio.Event().wait()
    seq = 0
    while True:
        await owned.wait()
        if not mgr.owns(groups[0]):
            await asyncio.sleep(0.01)
            continue
        seq += 1
        block = json.dumps({"gateway": args.gateway, "seq": seq}).encode().ljust(512)
        try:
            await device.write(0, block)
        except OSError as exc:
            emit(event="write_failed", errno=exc.errno, seq=seq)
            await asyncio.sleep(0.2)
            continue
        emit(event="write", seq=seq)
        await asyncio.sleep(0.02)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
