"""The control plane, at the edge of the target: JSON-RPC 2.0 (framed as SPDK's
rpc.py speaks it) with SPDK-compatible methods and pynvmf's own methods. The
configuration files those methods save and load are pynvmf.config's.

Everything here translates: parameters and files into calls of
pynvmf.target.target.Target's change methods, and the target's state back into
JSON. What a change means for connected hosts is the Target's decision, never
this package's.
"""
