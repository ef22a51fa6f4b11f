"""The host identity (Host NQN and Host Identifier) the pynvmf commands present, found
where nvme-cli finds it, so that a subsystem restricted to this machine's host NQN
accepts pynvmf as it accepts `nvme connect`, and a reservation holder keeps its
identity from one command to the next.

The Host NQN, first found of:
  1. -q/--hostnqn;
  2. $LIBNVME_HOSTNQN, as libnvme reads it (set and empty: skip step 3 too);
  3. the first line of /etc/nvme/hostnqn (what `nvme gen-hostnqn` writes there);
  4. the identity pynvmf stored on first use: $XDG_STATE_HOME/pynvmf/hostnqn
     (~/.local/state/pynvmf/hostnqn), a UUID NQN made once and reported on stderr then.
The Host Identifier: -I/--hostid; $LIBNVME_HOSTID or /etc/nvme/hostid likewise; else the
UUID of a UUID host NQN, as nvme-cli derives it; else $XDG_STATE_HOME/pynvmf/hostid,
made once.

$PYNVMF_NVME_CONFIG_DIR replaces /etc/nvme: for tests, and for a machine whose
nvme-cli configuration lives elsewhere.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from pynvmf.spec.nqn import UUID_NQN_PREFIX, nqn_problem

CONFIG_DIR_ENV = "PYNVMF_NVME_CONFIG_DIR"
DEFAULT_CONFIG_DIR = "/etc/nvme"
HOSTNQN_ENV = "LIBNVME_HOSTNQN"
HOSTID_ENV = "LIBNVME_HOSTID"


class IdentityError(ValueError):
    """A host identity source holds something that is not one: the message names it."""


@dataclass(frozen=True, slots=True)
class CommandIdentity:
    """The identity a command presents, and where each half came from (for messages)."""

    hostnqn: str
    hostid: bytes
    hostnqn_source: str
    hostid_source: str

    @property
    def hostid_text(self) -> str:
        return str(uuid.UUID(bytes=self.hostid))


def config_dir() -> Path:
    return Path(os.environ.get(CONFIG_DIR_ENV) or DEFAULT_CONFIG_DIR)


def state_dir() -> Path:
    """Where pynvmf keeps what it must remember between commands (XDG's state home)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "pynvmf"


def _first_line(path: Path) -> str | None:
    """The file's first line, stripped, as libnvme reads it; None if absent or empty."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            line = f.readline(1024).strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IdentityError(f"{path}: {exc.strerror}") from None
    return line or None


def _configured(env: str, name: str) -> tuple[str, str] | None:
    """(value, where it came from) from the environment or the nvme-cli file."""
    if env in os.environ:
        value = os.environ[env].strip()
        return (value, f"${env}") if value else None
    path = config_dir() / name
    value = _first_line(path)
    return (value, str(path)) if value is not None else None


def _parse_hostid(text: str, source: str) -> bytes:
    try:
        return uuid.UUID(text).bytes
    except ValueError:
        raise IdentityError(f"{source}: host ID {text!r} is not a UUID") from None


def _check_hostnqn(nqn: str, source: str) -> str:
    problem = nqn_problem(nqn)
    if problem is not None:
        raise IdentityError(f"{source}: host NQN {nqn!r} is not valid: {problem}")
    return nqn


def _uuid_of(nqn: str) -> bytes | None:
    if not nqn.startswith(UUID_NQN_PREFIX):
        return None
    try:
        return uuid.UUID(nqn[len(UUID_NQN_PREFIX) :]).bytes
    except ValueError:
        return None


def _stored(name: str, make: str) -> tuple[str, bool]:
    """The content of state_dir()/name, written as `make` if there is none yet; and
    whether this call wrote it. Written beside and linked into place, so that two
    commands starting at once agree on one value."""
    directory = state_dir()
    path = directory / name
    existing = _first_line(path)
    if existing is not None:
        return existing, False
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(make + "\n")
            os.link(tmp, path)
        finally:
            os.unlink(tmp)
    except FileExistsError:
        pass  # another command made it first: use theirs
    except OSError as exc:
        raise IdentityError(
            f"cannot store a host identity in {path}: {exc.strerror} "
            f"(give -q/--hostnqn, or write {config_dir() / name})"
        ) from None
    value = _first_line(path)
    if value is None:
        raise IdentityError(f"{path} is empty")
    return value, value == make


def resolve(hostnqn: str | None, hostid: bytes | None) -> CommandIdentity:
    """The identity a command presents, given its -q and -I (None when not given)."""
    nqn_source = "-q/--hostnqn"
    if hostnqn is None:
        found = _configured(HOSTNQN_ENV, "hostnqn")
        if found is not None:
            hostnqn, nqn_source = _check_hostnqn(found[0], found[1]), found[1]
        else:
            made = f"{UUID_NQN_PREFIX}{uuid.uuid4()}"
            hostnqn, new = _stored("hostnqn", made)
            nqn_source = str(state_dir() / "hostnqn")
            _check_hostnqn(hostnqn, nqn_source)
            if new:
                print(
                    f"pynvmf: this host is {hostnqn} from now on (no {config_dir()}/hostnqn; "
                    f"stored in {nqn_source}; `nvme gen-hostnqn > {config_dir()}/hostnqn` "
                    "gives the machine one nvme-cli shares)",
                    file=sys.stderr,
                )
    id_source = "-I/--hostid"
    if hostid is None:
        found = _configured(HOSTID_ENV, "hostid")
        derived = _uuid_of(hostnqn)
        if found is not None:
            hostid, id_source = _parse_hostid(found[0], found[1]), found[1]
        elif derived is not None:
            hostid, id_source = derived, f"the UUID of {hostnqn}"
        else:
            text, _ = _stored("hostid", str(uuid.uuid4()))
            id_source = str(state_dir() / "hostid")
            hostid = _parse_hostid(text, id_source)
    return CommandIdentity(hostnqn, hostid, nqn_source, id_source)


def describe(identity: CommandIdentity) -> str:
    """The host NQN and where it came from, as messages name it."""
    return f"{identity.hostnqn} (from {identity.hostnqn_source})"
