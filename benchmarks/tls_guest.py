"""The kTLS offload measured where a kernel has kTLS: pynvmf's target in the Linux 6.12
guest (its Python 3.13, trixie's cryptography) serving the guest kernel's NVMe/TCP host
(fio, libaio, O_DIRECT) over loopback, in plain NVMe/TCP, TLS with pynvmf's records in the
kernel (kTLS), and TLS with them in user space. The Linux host's records always go through
its kernel (tlshd does the handshake, then kTLS).

The guest runs under QEMU (KVM when PYNVMF_GUEST_KVM=1 works, else TCG, which emulates
every instruction and AES-NI too: absolute numbers are the emulator's, the ratios between
the modes are the point). Each round runs every workload on the three devices in turn
(the order rotating), --runtime seconds each; cells are medians of --repeat rounds.

    python3 benchmarks/tls_guest.py [--runtime 5] [--repeat 3] [--output docs/tls.md]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import statistics
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pynvmf.bench import report as R  # noqa: E402
from pynvmf.tcp.psk import HASH_SHA256, ConfiguredPsk  # noqa: E402
from tests.support.guest import LINUX_6_12, Guest  # noqa: E402

NQN = "nqn.2014-08.org.pynvmf:tls-bench"
HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000b7e6"
PORTS = {"plain": 44501, "TLS, kTLS": 44502, "TLS, user space": 44503}
WORKLOADS = {
    "4 KiB random read, QD32": "--rw=randread --bs=4k --iodepth=32",
    "128 KiB sequential read, QD8": "--rw=read --bs=128k --iodepth=8",
}
TLSHD_CONF = (
    "[debug]\nloglevel=0\ntls=0\nnl=0\n[authenticate]\nkeyrings=.nvme\n"
    "[authenticate.client]\n[authenticate.server]\n"
)


def bundle() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(REPO / "pynvmf", "pynvmf", filter=lambda i: None if "__pycache__" in i.name else i)
    return out.getvalue()


BEGIN = "<!-- guest results: begin (written by benchmarks/tls_guest.py) -->"
END = "<!-- guest results: end -->"


def write_block(path: Path, body: str) -> None:
    """Between this script's own markers (benchmarks/tls.py's results share the file)."""
    block = f"{BEGIN}\n{body.rstrip()}\n{END}"
    text = path.read_text() if path.exists() else "# NVMe/TCP over TLS 1.3\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", type=float, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", default="docs/tls.md", help="markdown file (or -)")
    args = parser.parse_args()
    key = ConfiguredPsk(HASH_SHA256, secrets.token_bytes(32))
    config = {
        "ports": [
            {"address": "127.0.0.1", "port": PORTS["plain"]},
            {"address": "127.0.0.1", "port": PORTS["TLS, kTLS"], "secure_channel": "required"},
            {
                "address": "127.0.0.1",
                "port": PORTS["TLS, user space"],
                "secure_channel": "required",
                "ktls": "off",
            },
        ],
        "discovery_ports": [],
        "subsystems": [
            {
                "nqn": NQN,
                "hosts": [{"nqn": HOST, "psk": key.encode()}, "nqn.2014-08.org.pynvmf:plain"],
                "namespaces": [{"nsid": 1, "memory": "512M"}],
            }
        ],
    }
    results: dict[str, dict[str, list[tuple[float, float, float]]]] = {
        w: {m: [] for m in PORTS} for w in WORKLOADS
    }
    with Guest(peer=LINUX_6_12, memory_mb=2048) as g:
        g.run("modprobe tls && modprobe nvme-tcp && modprobe nvme-keyring")
        g.write_file("/etc/tlshd.conf", TLSHD_CONF)
        g.run("(tlshd > /tmp/tlshd.log 2>&1 &); sleep 0.5; busybox pidof tlshd")
        g.write_file("/tmp/pynvmf.tgz", bundle())
        assert LINUX_6_12.python_bundle is not None
        g.write_file("/tmp/python.tgz", LINUX_6_12.python_bundle().read_bytes())
        g.run(
            "mkdir -p /opt/pynvmf && cd /opt/pynvmf"
            " && tar xzf /tmp/pynvmf.tgz && tar xzf /tmp/python.tgz"
        )
        g.write_file("/tmp/target.json", json.dumps(config), mode=0o600)
        g.run(
            "cd /tmp && (PYTHONPATH=/opt/pynvmf python3 -m pynvmf target -v"
            " --config /tmp/target.json > /tmp/target.out 2> /tmp/target.err &"
            " echo $! > /tmp/target.pid)\n"
            "for i in $(seq 300); do grep -q ready /tmp/target.out && exit 0; sleep 0.2; done;"
            " exit 1",
            timeout=120,
        )
        g.run(
            f"nvme gen-tls-key --secret {key.key.hex()} --hmac 1 --hostnqn {HOST}"
            f" --subsysnqn {NQN} --insert"
        )
        devices: dict[str, str] = {}
        for mode, port in PORTS.items():
            before = set(g.run("ls /dev | grep -E '^nvme[0-9]+n1$' || true").output.split())
            hostnqn = HOST if mode != "plain" else "nqn.2014-08.org.pynvmf:plain"
            # The kernel refuses one host ID under two host NQNs.
            hostid = "00000000-0000-4000-8000-0000000000" + ("01" if mode == "plain" else "02")
            tls = " --tls" if mode != "plain" else ""
            g.run(
                f"nvme connect -t tcp -a 127.0.0.1 -s {port} -n {NQN} --hostnqn {hostnqn}"
                f" --hostid {hostid} --nr-io-queues 1{tls}",
                timeout=150,
            )
            out = g.run(
                f"for i in $(seq 200); do for d in /sys/class/nvme/nvme*; do"
                f' [ "$(cat $d/address 2>/dev/null | grep -c trsvcid={port})" = 1 ] &&'
                ' for n in $d/nvme*n1; do b=$(basename $n | sed -E "s/c[0-9]+n/n/");'
                " [ -b /dev/$b ] && { echo $b; exit 0; }; done; done; sleep 0.1; done; exit 1"
            ).output.split()
            dev = out[-1]
            del before
            devices[mode] = f"/dev/{dev}"
        g.run(
            f"dd if=/dev/urandom of={devices['plain']} bs=1M count=512 oflag=direct status=none",
            timeout=600,
        )
        for r in range(args.repeat):
            for w, (workload, fio) in enumerate(WORKLOADS.items()):
                modes = list(PORTS)
                k = (r + w) % len(modes)
                for mode in modes[k:] + modes[:k]:
                    # The target's CPU time (user + system: kTLS seals and opens in its
                    # sendmsg/recvmsg) around the run: less sensitive to a loaded machine
                    # than throughput.
                    stat = "cut -d' ' -f14,15 /proc/$(cat /tmp/target.pid)/stat"
                    out = g.run(
                        f"{stat}; fio --name=b --filename={devices[mode]} {fio}"
                        " --ioengine=libaio --direct=1 --time_based"
                        f" --runtime={args.runtime:g} --ramp_time=1 --output-format=json"
                        f" > /tmp/fio.json; {stat}; cat /tmp/fio.json",
                        timeout=args.runtime * 4 + 120,
                    ).output
                    lines = out.splitlines()
                    before = sum(int(x) for x in lines[0].split())
                    after = sum(int(x) for x in lines[1].split())
                    job = json.loads(out[out.index("{") :])["jobs"][0]["read"]
                    ios = max(job["iops"] * (args.runtime + 1), 1)
                    cpu_us = (after - before) / 100 * 1e6 / ios  # USER_HZ 100
                    results[workload][mode].append((job["iops"], job["bw_bytes"] / 1e6, cpu_us))
                    print(
                        f"round {r + 1} {workload:<29} {mode:<16} {job['iops']:>9.0f} IOPS",
                        file=sys.stderr,
                    )
        log = g.run("cat /tmp/target.err").output
        offload = {
            "plain": "-",
            "TLS, kTLS": "kernel" if "records sent by the kernel (kTLS)" in log else "user",
            "TLS, user space": "user",
        }
        accel = g.accel
    headers = [
        "workload",
        "mode",
        "pynvmf's records by",
        "IOPS",
        "MB/s",
        "vs plain",
        "target CPU µs/IO",
        "CPU vs plain",
    ]
    rows = []
    for workload, by_mode in results.items():
        base = by_mode["plain"]
        for mode, runs in by_mode.items():
            ratio = statistics.median(a[0] / b[0] for a, b in zip(runs, base, strict=True))
            cpu_ratio = statistics.median(a[2] / b[2] for a, b in zip(runs, base, strict=True))
            rows.append(
                [
                    workload,
                    mode,
                    offload[mode],
                    f"{statistics.median(x[0] for x in runs):,.0f}",
                    f"{statistics.median(x[1] for x in runs):,.1f}",
                    f"{ratio:.2f}",
                    f"{statistics.median(x[2] for x in runs):,.0f}",
                    f"{cpu_ratio:.2f}",
                ]
            )
    setup = (
        f"Linux 6.12 guest under QEMU ({accel}), 2 vCPUs, 2 GiB; pynvmf's target in the guest "
        "(Python 3.13, no uvloop), one 512 MiB memory namespace written with random data, "
        "three ports; the guest kernel's host, one I/O queue per controller, fio libaio "
        f"O_DIRECT, {args.runtime:g} s per cell after 1 s ramp; modes rotating each round; "
        f"medians of {args.repeat} rounds; load average at end {R.load_line()}"
    )
    print(setup)
    print(R.text_table(headers, rows))
    if args.output != "-":
        body = "\n".join(
            [
                *(f"- {line}" for line in R.environment_lines()),
                f"- setup: {setup}",
                "",
                R.markdown_table(headers, rows),
            ]
        )
        write_block(Path(args.output), body)


if __name__ == "__main__":
    os.environ.setdefault("PYNVMF_GUEST_PEERS", "linux-6.12")
    main()
