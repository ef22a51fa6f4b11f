"""The Prometheus endpoint (`pynvmf target --metrics-listen`): a collector that reads
what the target already counts at scrape time, label values kept bounded, and the HTTP
server that answers `/metrics` on the target's event loop."""
