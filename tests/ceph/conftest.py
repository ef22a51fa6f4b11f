"""The Ceph tests' fixtures (the cluster itself is tests/conftest.py's `ceph_cluster`)."""
