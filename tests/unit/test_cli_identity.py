"""Where the commands' host identity comes from (pynvmf.cli.identity): -q/-I, libnvme's
variables, /etc/nvme as nvme-cli reads it, a Host ID from a UUID NQN, else one stored."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from pynvmf.cli.identity import IdentityError, resolve

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6d0c4f3a-0a39-4f6a-9f3e-4b7f0e0d1a01"
HOSTID = "6d0c4f3a-0a39-4f6a-9f3e-4b7f0e0d1a02"


@pytest.fixture
def etc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty /etc/nvme and state directory of the test's own."""
    etc = tmp_path / "etc"
    etc.mkdir()
    monkeypatch.setenv("PYNVMF_NVME_CONFIG_DIR", str(etc))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return etc


def test_etc_nvme_as_nvme_cli_reads_it(etc: Path) -> None:
    # The first line, whatever follows; surrounding space ignored.
    (etc / "hostnqn").write_text(f"  {HOSTNQN}\nsomething else\n")
    (etc / "hostid").write_text(HOSTID + "\n")
    identity = resolve(None, None)
    assert identity.hostnqn == HOSTNQN
    assert identity.hostid == uuid.UUID(HOSTID).bytes
    assert (identity.hostnqn_source, identity.hostid_source) == (
        str(etc / "hostnqn"),
        str(etc / "hostid"),
    )


def test_options_come_first(etc: Path) -> None:
    (etc / "hostnqn").write_text(HOSTNQN)
    (etc / "hostid").write_text(HOSTID)
    other = "nqn.2024-01.io.example:host"
    identity = resolve(other, b"\x01" * 16)
    assert (identity.hostnqn, identity.hostid) == (other, b"\x01" * 16)
    assert identity.hostnqn_source == "-q/--hostnqn" and identity.hostid_source == "-I/--hostid"
    # -q alone: the Host ID still comes from /etc/nvme/hostid, as nvme-cli's does.
    assert resolve(other, None).hostid == uuid.UUID(HOSTID).bytes


def test_libnvmes_variables_replace_the_files(etc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (etc / "hostnqn").write_text("nqn.2024-01.io.example:file")
    monkeypatch.setenv("LIBNVME_HOSTNQN", HOSTNQN)
    identity = resolve(None, None)
    assert (identity.hostnqn, identity.hostnqn_source) == (HOSTNQN, "$LIBNVME_HOSTNQN")
    # No hostid anywhere: the UUID of the UUID NQN, as nvme-cli derives it.
    assert identity.hostid == uuid.UUID(HOSTNQN.rsplit(":", 1)[1]).bytes


def test_without_anything_an_identity_is_made_once(
    etc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = resolve(None, None)
    stored = tmp_path / "state" / "pynvmf" / "hostnqn"
    assert stored.read_text() == first.hostnqn + "\n"
    assert first.hostid == uuid.UUID(first.hostnqn.rsplit(":", 1)[1]).bytes
    assert f"this host is {first.hostnqn} from now on" in capsys.readouterr().err
    again = resolve(None, None)
    assert again == first and capsys.readouterr().err == ""


def test_a_host_nqn_without_a_uuid_gets_a_stored_host_id(etc: Path, tmp_path: Path) -> None:
    (etc / "hostnqn").write_text("nqn.2024-01.io.example:my-host")
    first = resolve(None, None)
    assert first.hostid_source == str(tmp_path / "state" / "pynvmf" / "hostid")
    assert resolve(None, None).hostid == first.hostid


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("hostnqn", "nqn with spaces", "host NQN 'nqn with spaces' is not valid"),
        ("hostid", "not-a-uuid", "host ID 'not-a-uuid' is not a UUID"),
    ],
)
def test_a_bad_file_is_named(etc: Path, name: str, content: str, message: str) -> None:
    (etc / "hostnqn").write_text(HOSTNQN)
    (etc / name).write_text(content)
    with pytest.raises(IdentityError, match=f"^{etc / name}: {message}"):
        resolve(None, None)
