"""NVMe over Fabrics on RDMA (the NVMe/RDMA transport binding): the sans-I/O protocol layer.

- :mod:`pynvmf.rdma.cm`: the RDMA CM private data a host and a controller exchange while a
  queue's RDMA connection is set up (connect request, accept, reject with the status codes
  the binding names), and the controller's decision on a request.
- :mod:`pynvmf.rdma.sgl`: the keyed SGL data block descriptor a command carries to name host
  memory the controller reads (RDMA READ) or writes (RDMA WRITE).

Nothing here touches a verbs device: the transport (pyverbs, in a guest with soft-RoCE:
docs/rdma.md) drives these.
"""
