"""High availability across gateways: ANA group ownership through RADOS (lease.py)."""
