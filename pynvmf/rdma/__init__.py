"""NVMe over Fabrics on RDMA (the NVMe/RDMA transport binding).

- :mod:`pynvmf.rdma.cm`: the RDMA CM private data a host and a controller exchange while a
  queue's RDMA connection is set up (connect request, accept, reject with the status codes
  the binding names), and the controller's decision on a request.
- :mod:`pynvmf.rdma.sgl`: the keyed SGL data block descriptor a command carries to name host
  memory the controller reads (RDMA READ) or writes (RDMA WRITE).
- :mod:`pynvmf.rdma.queue`: the controller's end of a queue (sans-I/O): commands from the
  SENDs it receives, data in the capsule or by RDMA READ and WRITE, completions by SEND;
  the NVMe layer sees it through target/transport.py's QueueTransport.
- :mod:`pynvmf.rdma.verbs`: the adapter over rdma-core's pyverbs (the RDMA CM listener of
  an rdma port, each queue's queue pair and buffers); the only module that imports pyverbs,
  when an rdma port opens (in a guest with soft-RoCE here: docs/rdma.md).
"""
