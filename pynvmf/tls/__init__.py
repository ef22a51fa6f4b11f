"""The NVMe/TCP secure channel: TLS 1.3 with external pre-shared keys (NVMe/TCP Transport
1.1 §3.6, from TP 8011), and the offload of its record layer to the kernel (kTLS).

- `wire`: RFC 8446's code points, the cipher suites, vectors and extensions.
- `records`: AES-GCM record protection for one direction.
- `engine`: `TlsEngine`, a sans-I/O TLS 1.3 PSK handshake and record layer, both roles.
- `ktls`: handing one direction of an established engine to the kernel.
- `channel`: `SecureChannel`, the asyncio glue between a protocol and its transport.

The PSKs themselves (derivation, the interchange format) are pynvmf.tcp.psk's.
"""
