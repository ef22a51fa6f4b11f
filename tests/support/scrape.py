"""Scraping a Prometheus endpoint as Prometheus does: an HTTP GET, the text parsed by
prometheus-client's own parser, samples by name and labels."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def http_get(host: str, port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 request on a connection of its own."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def samples_of(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


async def scrape(host: str, port: int) -> Samples:
    status, body = await http_get(host, port, "/metrics")
    assert status == 200, body
    return samples_of(body.decode())


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}
