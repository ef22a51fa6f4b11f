"""NVMe over Fabrics on RDMA (the NVMe/RDMA transport binding).

- :mod:`pynvmf.rdma.cm`: the RDMA CM private data a host and a controller exchange while a
  queue's RDMA connection is set up (connect request, accept, reject with the status codes
  the binding names), and the controller's decision on a request.
- :mod:`pynvmf.rdma.sgl`: the keyed SGL data block descriptor a command carries to name host
  memory the controller reads (RDMA READ) or writes (RDMA WRITE).
- :mod:`pynvmf.rdma.queue`: the controller's end of a queue (sans-I/O): commands from the
  SENDs it receives, data in the capsule or by RDMA READ and WRITE, completions by SEND;
  the NVMe layer sees it through target/transport.py's QueueTransport.
- :mod:`pynvmf.rdma.host_queue`: the host's end of a queue (sans-I/O): command capsules
  with in-capsule data or a keyed SGL over registered memory, completions matched by CID;
  and the host library's asyncio queue over it (``pynvmf.host.connect(trtype="rdma")``).
- :mod:`pynvmf.rdma.host_verbs`: the host's adapter over pyverbs (the RDMA CM connect with
  the NVMe/RDMA private data, the queue pair, memory regions), imported when a host opens
  an rdma queue.
- :mod:`pynvmf.rdma.verbs`: the adapter over rdma-core's pyverbs (the RDMA CM listener of
  an rdma port, each queue's queue pair and buffers); the only module that imports pyverbs,
  when an rdma port opens (in a guest with soft-RoCE here: docs/rdma.md).
"""
