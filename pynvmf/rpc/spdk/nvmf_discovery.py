"""SPDK's discovery referral methods (nvmf_discovery_add_referral, _remove_referral,
_get_referrals): other discovery controllers, or subsystems elsewhere, that every host's
discovery log points to (pynvmf.target.referrals)."""

from __future__ import annotations

from typing import Any

from pynvmf.config.spdk import referral_json
from pynvmf.rpc.jsonrpc import INTERNAL_ERROR, RpcError
from pynvmf.rpc.methods import ControlPlane, MethodTable, Params
from pynvmf.rpc.spdk.calls import change_now, listen_address, no_target_name
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target.referrals import Referral

table = MethodTable()
method = table.register

# Target's parameter names as the caller wrote them.
_NAMES = {"address": "address.traddr", "port": "address.trsvcid", "subnqn": "subnqn"}


def _subnqn(p: Params) -> str:
    nqn = p.string("subnqn", None)
    # rpc.py turns "discovery" into the discovery NQN itself; an empty one is SPDK's
    # "none given" too.
    return nqn or DISCOVERY_NQN


@method("nvmf_discovery_add_referral")
async def nvmf_discovery_add_referral(cp: ControlPlane, p: Params) -> bool:
    address, port = listen_address(p, "address")
    no_target_name(p)
    secure = p.boolean("secure_channel", False)
    subnqn = _subnqn(p)
    p.done()
    referral = Referral(address, port, subnqn, secure)
    change_now(lambda: cp.target.add_referral(referral), _NAMES)
    return True


@method("nvmf_discovery_remove_referral")
async def nvmf_discovery_remove_referral(cp: ControlPlane, p: Params) -> bool:
    address, port = listen_address(p, "address")
    no_target_name(p)
    p.ignore("secure_channel")  # SPDK's decoder takes it here too, and ignores it
    subnqn = _subnqn(p)
    p.done()
    if cp.target.find_referral(address, port, subnqn) is None:
        # SPDK's answer for a referral it does not have.
        raise RpcError(INTERNAL_ERROR, "Unable to remove a referral.")
    change_now(lambda: cp.target.remove_referral(address, port, subnqn), _NAMES)
    return True


@method("nvmf_discovery_get_referrals")
async def nvmf_discovery_get_referrals(cp: ControlPlane, p: Params) -> list[dict[str, Any]]:
    no_target_name(p)
    p.done()
    return [referral_json(r) for r in cp.target.referrals]
