"""A Linux nvmet setup moves to pynvmf and back through nvmetcli's JSON.

The Linux 6.1 kernel under QEMU is the peer: its nvmet configfs is dumped as
`nvmetcli save` dumps it (every writable attribute of the groups nvmetcli knows, as
text), pynvmf starts from that file (`--nvmetcli-config`) and serves what nvmet served
to the Linux host, with the same identities; then what pynvmf writes
(`pynvmf rpc save-config --format nvmetcli`) is set up in configfs again as
`nvmetcli restore` would, every attribute accepted by the kernel, and dumps as the
original did.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pynvmf.rpc.client import RpcClient
from tests.interop.test_linux_host import DEV_FOR
from tests.support.guest import Guest, setup_kernel_target
from tests.support.ports import free_tcp_port
from tests.support.target_process import TargetProcess

NQN = "nqn.2024-11.dev.pynvmf:from-nvmet"
HOST_ID = "0f01fb42-9f7f-4856-b0b3-51e60b8de349"
HOST = f"nqn.2014-08.org.nvmexpress:uuid:{HOST_ID}"
NVMET = "/sys/kernel/config/nvmet"
SIZE_MB = 64

# Every file, link and directory of nvmet's configfs, one per line: what nvmetcli reads.
DUMP = rf"""cd {NVMET}
find . | while read -r f; do
  if [ -L "$f" ]; then printf 'L\t%s\t%s\n' "$f" "$(basename "$(readlink "$f")")"
  elif [ -d "$f" ]; then printf 'D\t%s\n' "$f"
  elif [ -f "$f" ]; then
    printf 'F\t%s\t%s\t%s\n' "$f" "$(stat -c %a "$f")" "$(cat "$f" 2>/dev/null | tr '\n' ' ')"
  fi
done
"""

# nvmetcli's attribute groups: a file <group>_<name> is attribute <name> of <group>.
GROUPS = {"subsystem": ("attr",), "namespace": ("device", "ana", "resv"), "port": ("addr", "param")}


def dump(guest: Guest) -> dict[str, Any]:
    """The configfs tree as nvmetcli's Root.dump() has it."""
    files: dict[str, tuple[bool, str]] = {}
    links: dict[str, str] = {}
    dirs: set[str] = set()
    for line in guest.run(DUMP).output.splitlines():
        kind, path, *rest = line.split("\t")
        path = path.removeprefix("./")
        if kind == "F":
            files[path] = (int(rest[0], 8) & 0o200 != 0, rest[1].strip() if len(rest) > 1 else "")
        elif kind == "L":
            links[path] = rest[0]
        else:
            dirs.add(path)

    def children(parent: str) -> list[str]:
        return sorted(
            d.rpartition("/")[2] for d in dirs | set(links) if d.rpartition("/")[0] == parent
        )

    def attrs(node: str, kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for group in GROUPS[kind]:
            prefix = f"{node}/{group}_"
            out[group] = {
                path.removeprefix(prefix): value
                for path, (writable, value) in files.items()
                if path.startswith(prefix) and "/" not in path.removeprefix(prefix) and writable
            }
        if f"{node}/enable" in files:
            out["enable"] = int(files[f"{node}/enable"][1])
        return out

    subsystems = []
    for nqn in children("subsystems"):
        node = f"subsystems/{nqn}"
        namespaces = []
        for nsid in children(f"{node}/namespaces"):
            ns_node = f"{node}/namespaces/{nsid}"
            ns = attrs(ns_node, "namespace")
            ns["nsid"] = int(nsid)
            ns["ana_grpid"] = int(files.get(f"{ns_node}/ana_grpid", (True, "0"))[1])
            namespaces.append(ns)
        sub = attrs(node, "subsystem")
        sub.update(nqn=nqn, namespaces=namespaces, allowed_hosts=children(f"{node}/allowed_hosts"))
        subsystems.append(sub)
    ports = []
    for portid in children("ports"):
        node = f"ports/{portid}"
        port = attrs(node, "port")
        port["portid"] = int(portid)
        port["subsystems"] = children(f"{node}/subsystems")
        port["referrals"] = []
        port["ana_groups"] = [
            {"ana": {"state": files[f"{node}/ana_groups/{g}/ana_state"][1]}, "grpid": int(g)}
            for g in children(f"{node}/ana_groups")
        ]
        ports.append(port)
    hosts = [{"nqn": h} for h in children("hosts")]
    return {"hosts": hosts, "ports": ports, "subsystems": subsystems}


def restore(guest: Guest, config: dict[str, Any]) -> None:
    """Set `config` up in configfs in nvmetcli restore's order; every attribute the
    kernel refuses is reported (nvmetcli would skip it with an error)."""
    q = shlex.quote
    lines = [f"cd {NVMET}", "bad=0"]

    def write(path: str, value: Any) -> None:
        lines.append(
            f"printf %s {q(str(value))} > {q(path)} || {{ echo REFUSED {q(path)}; bad=1; }}"
        )

    for host in config["hosts"]:
        lines.append(f"mkdir -p {q('hosts/' + host['nqn'])}")
    for sub in config["subsystems"]:
        node = f"subsystems/{sub['nqn']}"
        lines.append(f"mkdir {q(node)}")
        for ns in sub["namespaces"]:
            ns_node = f"{node}/namespaces/{ns['nsid']}"
            lines.append(f"mkdir {q(ns_node)}")
            for group in GROUPS["namespace"]:
                for name, value in ns.get(group, {}).items():
                    write(f"{ns_node}/{group}_{name}", value)
            if "enable" in ns:
                write(f"{ns_node}/enable", ns["enable"])
        for host in sub["allowed_hosts"]:
            lines.append(
                f"ln -s {q(NVMET + '/hosts/' + host)} {q(node + '/allowed_hosts/' + host)}"
            )
        for name, value in sub["attr"].items():
            write(f"{node}/attr_{name}", value)
    for port in config["ports"]:
        node = f"ports/{port['portid']}"
        lines.append(f"mkdir {q(node)}")
        for group in GROUPS["port"]:
            for name, value in port.get(group, {}).items():
                write(f"{node}/{group}_{name}", value)
        for group in port["ana_groups"]:
            write(f"{node}/ana_groups/{group['grpid']}/ana_state", group["ana"]["state"])
        for nqn in port["subsystems"]:
            lines.append(
                f"ln -s {q(NVMET + '/subsystems/' + nqn)} {q(node + '/subsystems/' + nqn)}"
            )
    lines.append("exit $bad")
    result = guest.run("\n".join(lines) + "\n", check=False)
    assert result.rc == 0, result.output


def clear(guest: Guest) -> None:
    guest.run(
        f"cd {NVMET}\n"
        'for p in ports/*; do [ -d "$p" ] || continue; rm -f "$p"/subsystems/*; rmdir "$p"; done\n'
        'for s in subsystems/*; do [ -d "$s" ] || continue\n'
        '  for n in "$s"/namespaces/*; do\n'
        '    [ -d "$n" ] && { echo 0 > "$n/enable"; rmdir "$n"; }\n'
        "  done\n"
        '  rm -f "$s"/allowed_hosts/*; rmdir "$s"; done\n'
        'for h in hosts/*; do [ -d "$h" ] && rmdir "$h"; done; true\n'
    )


def normal(config: dict[str, Any]) -> dict[str, Any]:
    """What two dumps of one setup share: nvmet's -1 ('the transport's default', 16 KiB
    for TCP) and 16384 are one in-capsule size."""
    out = copy.deepcopy(config)
    for port in out["ports"]:
        if port.get("param", {}).get("inline_data_size") == "-1":
            port["param"]["inline_data_size"] = "16384"
    return out


@pytest.fixture(scope="module")
def guest() -> Iterator[Guest]:
    g = Guest(extra_files={"/usr/local/bin/dev-for": DEV_FOR})
    g.start()
    yield g
    g.stop()


def test_a_linux_target_moves_to_pynvmf_and_back(guest: Guest, tmp_path: Path) -> None:
    nvmet_port = free_tcp_port()
    kernel = setup_kernel_target(guest, port=nvmet_port, nqn=NQN, size_mb=SIZE_MB)
    s = f"{NVMET}/subsystems/{NQN}"
    guest.run(
        f"mkdir {NVMET}/hosts/{HOST} && echo 0 > {s}/attr_allow_any_host && "
        f"ln -s {NVMET}/hosts/{HOST} {s}/allowed_hosts/{HOST} && "
        f"printf %s pynvmf-interop > {s}/attr_model"
    )
    original = dump(guest)
    (sub,) = original["subsystems"]
    assert sub["attr"]["model"] == "pynvmf-interop" and sub["allowed_hosts"] == [HOST]
    (ns,) = sub["namespaces"]
    ns_uuid = ns["device"]["uuid"]

    # To pynvmf: the same setup, its namespace on a file here and its port on this machine.
    image = tmp_path / "ns.img"
    image.write_bytes(bytes(SIZE_MB << 20))
    moved = copy.deepcopy(original)
    moved["subsystems"][0]["namespaces"][0]["device"]["path"] = str(image)
    port = free_tcp_port()
    moved["ports"][0]["addr"].update(traddr="127.0.0.1", trsvcid=str(port))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(moved))
    socket = str(tmp_path / "rpc.sock")
    proc = TargetProcess(None, tmp_path, ["--nvmetcli-config", str(config), "--rpc-socket", socket])
    proc.start()
    try:
        # The Linux host sees pynvmf's namespace with the identities nvmet gave it.
        guest.run(
            f"nvme connect -t tcp -a {Guest.host_address} -s {port} -n {NQN} "
            f"--hostnqn={HOST} --hostid={HOST_ID}"
        )
        dev = guest.run(f"sh /usr/local/bin/dev-for {NQN}").output.strip()
        name = dev.removeprefix("/dev/")
        assert guest.run(f"cat /sys/block/{name}/uuid").output.strip() == ns_uuid
        descs = guest.run(f"nvme ns-descs {dev}").output.lower()
        assert "uuid" in descs and "eui64" not in descs  # nvmet reported no EUI-64
        assert "disconnected 1 controller" in guest.run(f"nvme disconnect -n {NQN}").output
        with RpcClient(socket) as rpc:
            written = rpc.call("pynvmf_get_config", format="nvmetcli")
    finally:
        proc.stop()

    # And back: what pynvmf wrote, with the guest's device and port again.
    written["subsystems"][0]["namespaces"][0]["device"]["path"] = ns["device"]["path"]
    written["ports"][0]["addr"].update(original["ports"][0]["addr"])
    del kernel  # its device stays: the restored namespace serves it again
    clear(guest)
    restore(guest, written)
    again = dump(guest)
    assert normal(again) == normal(original)
    # The restored target serves the Linux host as before.
    out = guest.run(f"nvme discover -t tcp -a 127.0.0.1 -s {nvmet_port} --hostnqn={HOST}").output
    assert NQN in out
