"""A minimal HTTP/1.1 client for streamed completions (plain http only): asyncio streams, the chunked
body split into server-sent events by hand, JSON parsed once per event.

Why not httpx: on a small machine the benchmark client shares the cores with the server it measures,
and httpx's pure-Python HTTP machinery costs ~0.5 ms of CPU per streamed chunk (about a core-second
per 2,000 tokens), which a 2-core server then loses. This client costs a few microseconds per chunk.
https URLs (or --client httpx) use httpx.
"""
from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit


class HTTPStatusError(Exception):
    pass


async def stream_events(url: str, body: dict, headers: dict, timeout: float):
    """Yields each SSE event's data payload (str) of a POST to `url` returning text/event-stream;
    raises HTTPStatusError for a non-200 answer (with the start of its body)."""
    u = urlsplit(url)
    host, port = u.hostname, u.port or 80
    payload = json.dumps(body).encode()
    head = [f"POST {u.path or '/'}{'?' + u.query if u.query else ''} HTTP/1.1", f"Host: {u.netloc}",
            "Content-Type: application/json", f"Content-Length: {len(payload)}", "Accept: text/event-stream",
            "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout)
        parts = status_line.split()
        status = int(parts[1]) if len(parts) > 1 else 0
        chunked, length = False, None
        while True:
            line = await asyncio.wait_for(reader.readline(), timeout)
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            k, v = k.strip().lower(), v.strip()
            if k == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
            elif k == "content-length":
                length = int(v)
        if status != 200:
            data = await asyncio.wait_for(reader.read(length if length is not None else 2000), timeout)
            raise HTTPStatusError(f"HTTP {status}: {data[:200]!r}")
        buf = b""
        while True:
            if chunked:
                size_line = await asyncio.wait_for(reader.readline(), timeout)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                data = await asyncio.wait_for(reader.readexactly(size + 2), timeout)
                data = data[:-2]
            else:
                data = await asyncio.wait_for(reader.read(65536), timeout)
                if not data:
                    break
            buf += data.replace(b"\r\n", b"\n")
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data: "):
                        yield line[6:].decode()
    finally:
        writer.close()
