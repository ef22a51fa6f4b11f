"""DH-HMAC-CHAP keys in the control plane and the configuration formats: the keyring
(key files by name), host keys from pynvmf's file, SPDK's RPC methods and nvmetcli's
JSON; every output names or redacts a key and never shows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pynvmf.auth import DhchapKey
from pynvmf.config.native import ConfigError, apply_config, config_of
from pynvmf.config.nvmetcli import load_nvmetcli, nvmetcli_config
from pynvmf.config.spdk import load_spdk_config, spdk_config
from pynvmf.rpc.jsonrpc import INVALID_PARAMS, RpcError
from pynvmf.rpc.methods import ControlPlane
from pynvmf.rpc.server import control_plane
from pynvmf.spec.auth import DhGroupId, HashId
from pynvmf.target.target import Target

NQN = "nqn.2016-06.io.spdk:cnode1"
HOST = "nqn.2014-08.org.nvmexpress:uuid:0f8c5d8e-0000-4000-8000-000000000001"
KEY = DhchapKey.generate(32)
CKEY = DhchapKey.generate(48)


def _key_file(tmp_path: Path, name: str, key: DhchapKey) -> str:
    path = tmp_path / f"{name}.key"
    path.write_text(key.representation())
    path.chmod(0o600)
    return str(path)


def _no_secret(text: str) -> None:
    for key in (KEY, CKEY):
        assert key.representation() not in text
        assert key.representation().split(":")[2][:12] not in text


@pytest.fixture
def cp() -> ControlPlane:
    return control_plane(Target())


async def _spdk_setup(cp: ControlPlane, tmp_path: Path) -> None:
    await cp.call("keyring_file_add_key", {"name": "key0", "path": _key_file(tmp_path, "k0", KEY)})
    await cp.call(
        "keyring_file_add_key", {"name": "ckey0", "path": _key_file(tmp_path, "c0", CKEY)}
    )
    await cp.call("nvmf_create_subsystem", {"nqn": NQN})
    await cp.call(
        "nvmf_subsystem_add_host",
        {"nqn": NQN, "host": HOST, "dhchap_key": "key0", "dhchap_ctrlr_key": "ckey0"},
    )


async def test_spdk_methods_set_keys_and_outputs_name_them(
    cp: ControlPlane, tmp_path: Path
) -> None:
    await _spdk_setup(cp, tmp_path)
    auth = cp.target.subsystems[NQN].host_auth[HOST]
    assert auth.host_key == KEY and auth.ctrl_key == CKEY
    subsystems = await cp.call("nvmf_get_subsystems", {"nqn": NQN})
    assert subsystems[0]["hosts"] == [
        {"nqn": HOST, "dhchap_key": "key0", "dhchap_ctrlr_key": "ckey0"}
    ]
    keys = await cp.call("keyring_get_keys", {})
    assert [(k["name"], k["path"]) for k in keys] == [
        ("key0", str(tmp_path / "k0.key")),
        ("ckey0", str(tmp_path / "c0.key")),
    ]
    saved = spdk_config(cp.target)
    _no_secret(json.dumps([subsystems, keys, saved, config_of(cp.target)]))
    # SPDK's save_config holds the keyring and the names; loading it builds the same.
    other = control_plane(Target())
    await load_spdk_config(other, json.loads(json.dumps(saved)))
    again = other.target.subsystems[NQN].host_auth[HOST]
    assert (again.host_key, again.ctrl_key, again.host_key_name) == (KEY, CKEY, "key0")


async def test_set_keys_changes_and_removes(cp: ControlPlane, tmp_path: Path) -> None:
    await _spdk_setup(cp, tmp_path)
    new = DhchapKey.generate(64)
    await cp.call("keyring_file_add_key", {"name": "key1", "path": _key_file(tmp_path, "k1", new)})
    await cp.call("nvmf_subsystem_set_keys", {"nqn": NQN, "host": HOST, "dhchap_key": "key1"})
    auth = cp.target.subsystems[NQN].host_auth[HOST]
    assert auth.host_key == new and auth.ctrl_key is None
    with pytest.raises(RpcError, match="in use"):
        await cp.call("keyring_file_remove_key", {"name": "key1"})
    await cp.call("nvmf_subsystem_set_keys", {"nqn": NQN, "host": HOST})
    assert HOST not in cp.target.subsystems[NQN].host_auth
    await cp.call("keyring_file_remove_key", {"name": "key1"})
    assert "key1" not in cp.target.keyring


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("keyring_file_add_key", {"name": "k", "path": "/nonexistent/k"}, "path: cannot read"),
        (
            "nvmf_subsystem_add_host",
            {"nqn": NQN, "host": HOST, "dhchap_key": "nokey"},
            "dhchap_key",
        ),
        (
            "nvmf_subsystem_add_host",
            {"nqn": NQN, "host": HOST, "dhchap_ctrlr_key": "key0"},
            "dhchap_key: a controller key needs a host key",
        ),
        ("nvmf_set_config", {"dhchap_digests": ["md5"]}, "dhchap_digests: unknown"),
        ("nvmf_set_config", {"dhchap_dhgroups": ["ffdhe1024"]}, "dhchap_dhgroups: unknown"),
    ],
)
async def test_bad_key_parameters_are_refused(
    cp: ControlPlane, tmp_path: Path, method: str, params: dict[str, Any], message: str
) -> None:
    await cp.call("keyring_file_add_key", {"name": "key0", "path": _key_file(tmp_path, "k0", KEY)})
    await cp.call("nvmf_create_subsystem", {"nqn": NQN})
    with pytest.raises(RpcError) as info:
        await cp.call(method, params)
    assert info.value.code == INVALID_PARAMS and info.value.message.startswith(message), (
        info.value.message
    )
    assert HOST not in cp.target.subsystems[NQN].allowed_hosts


async def test_set_config_digests_and_groups_apply_to_new_keys(
    cp: ControlPlane, tmp_path: Path
) -> None:
    await cp.call(
        "nvmf_set_config",
        {"dhchap_digests": ["sha384", "sha512"], "dhchap_dhgroups": ["ffdhe3072", "null"]},
    )
    await _spdk_setup(cp, tmp_path)
    auth = cp.target.subsystems[NQN].host_auth[HOST]
    assert auth.hashes == (HashId.SHA384, HashId.SHA512)
    assert auth.dhgroups == (DhGroupId.FFDHE3072, DhGroupId.NULL)


async def test_pynvmf_config_round_trip(tmp_path: Path) -> None:
    config = {
        "keyring": [
            {"name": "h", "path": _key_file(tmp_path, "h", KEY)},
            {"name": "c", "path": _key_file(tmp_path, "c", CKEY)},
        ],
        "ports": [],
        "discovery_ports": [],
        "subsystems": [
            {
                "nqn": NQN,
                "hosts": [
                    {
                        "nqn": HOST,
                        "dhchap_key": "h",
                        "dhchap_ctrl_key": "c",
                        "dhchap_hash": "sha512",
                        "dhchap_dhgroup": ["ffdhe4096", "null"],
                    },
                    "nqn.2014-08.org.example:plain",
                ],
            }
        ],
    }
    target = Target()
    await apply_config(target, config)
    auth = target.subsystems[NQN].host_auth[HOST]
    assert auth.hashes == (HashId.SHA512,) and auth.dhgroups[0] == DhGroupId.FFDHE4096
    written = config_of(target)
    _no_secret(json.dumps(written))
    assert written["keyring"] == config["keyring"]
    again = Target()
    await apply_config(again, json.loads(json.dumps(written)))
    assert again.subsystems[NQN].host_auth == target.subsystems[NQN].host_auth


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ({"nqn": HOST, "dhchap_key": "missing"}, "hosts[0].dhchap_key: no key named"),
        ({"nqn": HOST, "dhchap_ctrl_key": "h"}, "hosts[0].dhchap_key: DH-HMAC-CHAP settings"),
        ({"nqn": HOST, "dhchap_key": "h", "dhchap_hash": "md5"}, "hosts[0].dhchap_hash: unknown"),
        (
            {"nqn": HOST, "dhchap_key": "h", "dhchap_secret": "x"},
            "hosts[0].dhchap_secret: unknown key",
        ),
    ],
)
async def test_pynvmf_config_errors_name_the_key(
    tmp_path: Path, host: dict[str, Any], message: str
) -> None:
    config = {
        "keyring": [{"name": "h", "path": _key_file(tmp_path, "h", KEY)}],
        "ports": [],
        "subsystems": [{"nqn": NQN, "hosts": [host]}],
    }
    with pytest.raises(ConfigError) as info:
        await apply_config(Target(), config)
    assert message in str(info.value), str(info.value)


def _nvmetcli(host: dict[str, Any]) -> dict[str, Any]:
    return {
        "hosts": [host],
        "ports": [],
        "subsystems": [
            {"allowed_hosts": [HOST], "attr": {"allow_any_host": "0"}, "namespaces": [], "nqn": NQN}
        ],
    }


@pytest.mark.parametrize("flat", [False, True], ids=["group", "flat"])
async def test_nvmetcli_host_attributes_load_and_export_redacted(flat: bool) -> None:
    attrs = {
        "key": KEY.representation(),
        "ctrl_key": CKEY.representation(),
        "hash": "hmac(sha384)",
        "dhgroup": "ffdhe3072",
    }
    host: dict[str, Any] = {"nqn": HOST}
    if flat:
        host.update({f"dhchap_{k}": v for k, v in attrs.items()})
    else:
        host["dhchap"] = attrs
    target = Target()
    await load_nvmetcli(target, _nvmetcli(host))
    auth = target.subsystems[NQN].host_auth[HOST]
    assert (auth.host_key, auth.ctrl_key) == (KEY, CKEY)
    # nvmet prefers the configured hash and group, and falls back to what the host offers.
    assert auth.hashes[0] == HashId.SHA384 and len(auth.hashes) == 3
    assert auth.dhgroups[0] == DhGroupId.FFDHE3072 and len(auth.dhgroups) == 6
    out = nvmetcli_config(target)
    _no_secret(json.dumps(out))
    assert out["hosts"] == [
        {
            "nqn": HOST,
            "dhchap": {
                "key": "<redacted>",
                "ctrl_key": "<redacted>",
                "hash": "hmac(sha384)",
                "dhgroup": "ffdhe3072",
            },
        }
    ]
    # Written out again, the redacted key is refused rather than taken as no key.
    with pytest.raises(RpcError, match="DHHC-1"):
        await load_nvmetcli(Target(), out)


async def test_nvmetcli_bad_key_is_refused_without_showing_it() -> None:
    text = KEY.representation()
    body = text.split(":")[2]
    bad = text.replace(body, ("B" if body[0] == "A" else "A") + body[1:])
    with pytest.raises(RpcError) as info:
        await load_nvmetcli(Target(), _nvmetcli({"nqn": HOST, "dhchap": {"key": bad}}))
    assert "hosts[0].dhchap.key" in str(info.value) and "CRC" in str(info.value)
    assert body[1:13] not in str(info.value)


async def test_keys_given_as_text_serve_like_file_keys_and_are_never_shown(
    cp: ControlPlane,
) -> None:
    """pynvmf_keyring_add_key: for a controller that cannot write the target's files
    (blktests' control script runs on the host under test)."""
    psk = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
    await cp.call("pynvmf_keyring_add_key", {"name": "key0", "key": KEY.representation()})
    await cp.call("pynvmf_keyring_add_key", {"name": "ckey0", "key": CKEY.representation()})
    await cp.call("pynvmf_keyring_add_key", {"name": "psk0", "key": psk})
    await cp.call("nvmf_create_subsystem", {"nqn": NQN})
    await cp.call(
        "nvmf_subsystem_add_host",
        {
            "nqn": NQN,
            "host": HOST,
            "dhchap_key": "key0",
            "dhchap_ctrlr_key": "ckey0",
            "psk": "psk0",
        },
    )
    auth = cp.target.subsystems[NQN].host_auth[HOST]
    assert auth.host_key == KEY and auth.ctrl_key == CKEY
    assert cp.target.subsystems[NQN].host_psks[HOST].encode() == psk
    keys = await cp.call("keyring_get_keys", {})
    assert [(k["name"], k["path"]) for k in keys] == [("key0", ""), ("ckey0", ""), ("psk0", "")]
    outputs = json.dumps([keys, await cp.call("nvmf_get_subsystems", {}), spdk_config(cp.target)])
    _no_secret(outputs)
    assert psk.split(":")[2][:12] not in outputs
    # A saved configuration names no file for them: loading it fails loudly, not keyless.
    with pytest.raises(RpcError):
        await load_spdk_config(
            control_plane(Target()), json.loads(json.dumps(spdk_config(cp.target)))
        )
    # Refused: a name taken, a key that is not one (without echoing it), no key.
    for params, why in (
        ({"name": "key0", "key": KEY.representation()}, "name: key 'key0' exists"),
        ({"name": "bad", "key": "DHHC-1:01:c2VjcmV0Cg==:"}, "key: "),
        ({"name": "bad", "key": "NVMeTLSkey-1:01:c2VjcmV0Cg==:"}, "key: "),
        ({"name": "bad"}, "key"),
    ):
        with pytest.raises(RpcError) as info:
            await cp.call("pynvmf_keyring_add_key", params)
        assert info.value.code == INVALID_PARAMS and why in info.value.message
        assert "c2VjcmV0" not in info.value.message
    assert "bad" not in cp.target.keyring
