"""The gateway group's shared keys (pynvmf.ha.shared) without a cluster: what a running
target is as keys (a namespace's hosts one key each, its ANA group in its own key), and
how a namespace key of earlier gateways (its hosts in a list) is read.
tests/ceph/test_shared_config.py keeps two gateways in step through RADOS."""

from __future__ import annotations

import json

from pynvmf.config.native import apply_config
from pynvmf.ha.shared import shared_keys, upgraded
from pynvmf.target.target import Target

NQN = "nqn.2024-11.dev.pynvmf:keys"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-00000000000a"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:0000000b-0000-4000-8000-00000000000b"
HOST_C = "nqn.2014-08.org.nvmexpress:uuid:0000000c-0000-4000-8000-00000000000c"


async def test_a_hidden_namespace_is_one_key_and_one_key_per_host() -> None:
    target = Target()
    hidden = {"memory": "1M", "auto_visible": False, "hosts": [HOST_B, HOST_A], "anagrpid": 3}
    await apply_config(
        target, {"subsystems": [{"nqn": NQN, "namespaces": [{"memory": "1M"}, hidden]}]}
    )
    keys = shared_keys(target, "gw-a")
    one, two = json.loads(keys[f"namespace {NQN} 1"]), json.loads(keys[f"namespace {NQN} 2"])
    assert "auto_visible" not in one and "anagrpid" not in one
    assert (two["auto_visible"], two["anagrpid"]) == (False, 3) and "hosts" not in two
    assert {k for k in keys if k.startswith("namespace_host ")} == {
        f"namespace_host {NQN} 2 {HOST_A}",
        f"namespace_host {NQN} 2 {HOST_B}",
    }
    # Attached to one more host: one key more, the namespace's own key unchanged.
    await target.ns_add_host(NQN, 2, HOST_C)
    after = shared_keys(target, "gw-a")
    assert after[f"namespace {NQN} 2"] == keys[f"namespace {NQN} 2"]
    assert len(after) == len(keys) + 1
    # Moved to another ANA group: the namespace's key alone changes.
    target.set_namespace_ana_group(NQN, 2, 4)
    moved = shared_keys(target, "gw-a")
    assert {k for k in moved if moved[k] != after[k]} == {f"namespace {NQN} 2"}
    await target.stop()


def test_an_earlier_namespace_key_with_a_host_list_reads_as_namespace_host_keys() -> None:
    legacy = json.dumps({"nsid": 2, "memory": 1 << 20, "auto_visible": False, "hosts": [HOST_A]})
    older = json.dumps({"nsid": 1, "memory": 1 << 20})  # before per-host visibility
    keys = {f"namespace {NQN} 1": older, f"namespace {NQN} 2": legacy}
    read, rewrites = upgraded(keys)
    assert read[f"namespace {NQN} 1"] == older
    assert "hosts" not in json.loads(read[f"namespace {NQN} 2"])
    assert read[f"namespace_host {NQN} 2 {HOST_A}"] == "{}"
    assert set(rewrites) == {f"namespace {NQN} 2", f"namespace_host {NQN} 2 {HOST_A}"}
    # Read again as written back: nothing more to rewrite.
    assert upgraded(read) == (read, {})
    # Not a list of host NQNs: left as it is, for applying it to name what is wrong.
    bad = {f"namespace {NQN} 3": json.dumps({"nsid": 3, "hosts": "everyone"})}
    assert upgraded(bad) == (bad, {})
