#!/usr/bin/env python3
"""A sample backend in another language, for the gateway's tests.

Python's standard library only. Listens on $LISTEN (host:port) and counts
every execution of a write in the SQLite file $BACKEND_DB (table
`payments`), so a test can tell how many times each payment ran.

  GET  /healthz             200 {"status":"ok"}
  POST /payments            JSON {"amount": int, ...} -> 201 {"id", "amount", "tenant"}
                            invalid JSON 400, not a payment 422 (duplicate keys too)
  POST /slow?seconds=S      records an execution, then sleeps S seconds (default 60), then 201
  POST /fail                500, records an execution
  POST /switch              101 Switching Protocols (unasked), records an execution
  GET  /echo                200 JSON of the request line and headers as received
  GET  /download?bytes=N    N bytes of a fixed pattern, streamed in 64 KiB writes
  POST /upload              sha256 and length of the body, read in a stream
  POST /mcp                 a minimal MCP server (Streamable HTTP, stateless, JSON
                            answers): initialize, ping, tools/list, tools/call of
                            send_email {to, subject, idempotency_key}, which
                            records an execution (path /mcp) and answers
                            "sent email #<row> to <to>"; notifications get 202.
                            GET /mcp is 405 (no server-initiated stream).

Lenient, as Express and Werkzeug are: paths are normalised before routing
(`;` parameters dropped, percent-escapes decoded, `\\` taken as `/`, dot and
empty segments resolved, no trailing slash) and methods are matched in any
case (`post` runs `do_POST`), so the gateway's tests can show that no
spelling of a guarded request reaches it twice.
"""

import hashlib
import json
import os
import sqlite3
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

DB = os.environ["BACKEND_DB"]
LOCK = threading.Lock()
PATTERN = bytes(range(256)) * 256  # 64 KiB


def record(path, amount, key, tenant):
    with LOCK:
        conn = sqlite3.connect(DB, timeout=30)
        try:
            cur = conn.execute(
                "insert into payments (path, amount, idempotency_key, tenant) values (?, ?, ?, ?)",
                (path, amount, key, tenant),
            )
            conn.commit()
            return cur.lastrowid
        finally:
            conn.close()


class DuplicateKey(Exception):
    """An object with a key twice: not a payment."""


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise DuplicateKey()
    return dict(pairs)


def lenient_path(path):
    """The path a lenient backend routes `path` to."""
    segments = []
    for segment in unquote(path).replace("\\", "/").split("/"):
        segment = segment.split(";", 1)[0]
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    return "/" + "/".join(segments)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def __getattr__(self, name):
        # Methods in any case: `do_post` and `do_Post` are `do_POST`.
        if name.startswith("do_") and name[3:] != name[3:].upper():
            return getattr(self, "do_" + name[3:].upper())
        raise AttributeError(name)

    def log_message(self, fmt, *args):
        pass

    def answer(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/healthz":
            return self.answer(200, {"status": "ok"})
        if url.path == "/echo":
            headers = [[k.lower(), v] for k, v in self.headers.items()]
            return self.answer(200, {"method": "GET", "path": self.path, "headers": headers})
        if url.path == "/download":
            size = int(parse_qs(url.query).get("bytes", ["0"])[0])
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream")
            self.send_header("content-length", str(size))
            self.end_headers()
            sent = 0
            while sent < size:
                chunk = PATTERN[: min(len(PATTERN), size - sent)]
                self.wfile.write(chunk)
                sent += len(chunk)
            return None
        if url.path == "/mcp":
            return self.answer(405, {"error": "no server-initiated stream"})
        return self.answer(404, {"error": "not found"})

    def mcp(self, raw, key, tenant):
        """One JSON-RPC message to the minimal MCP server."""
        try:
            message = json.loads(raw)
        except ValueError:
            return self.answer(400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}})
        if not isinstance(message, dict) or "method" not in message:
            return self.answer(400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "invalid request"}})
        if "id" not in message:
            return self.answer(202, b"")
        method, params, rid = message["method"], message.get("params") or {}, message["id"]
        if method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "backend", "version": "1.0.0"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            schema = {
                "type": "object",
                "properties": {"to": {"type": "string"}, "subject": {"type": "string"}, "idempotency_key": {"type": "string"}},
                "required": ["to", "subject"],
            }
            result = {"tools": [{"name": "send_email", "description": "Send an email.", "inputSchema": schema}]}
        elif method == "tools/call" and params.get("name") == "send_email":
            arguments = params.get("arguments") or {}
            row = record("/mcp", None, arguments.get("idempotency_key", key), tenant)
            text = f"sent email #{row} to {arguments.get('to')}"
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        else:
            return self.answer(200, {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})
        return self.answer(200, {"jsonrpc": "2.0", "id": rid, "result": result})

    def do_POST(self):
        url = urlsplit(self.path)
        url = url._replace(path=lenient_path(url.path))
        key = self.headers.get("idempotency-key")
        tenant = self.headers.get("x-tenant")
        if url.path == "/upload":
            length = int(self.headers.get("content-length") or 0)
            digest, left = hashlib.sha256(), length
            while left > 0:
                chunk = self.rfile.read(min(65536, left))
                if not chunk:
                    break
                digest.update(chunk)
                left -= len(chunk)
            return self.answer(200, {"sha256": digest.hexdigest(), "length": length - left})
        raw = self.body()
        if url.path == "/slow":
            record(url.path, None, key, tenant)
            time.sleep(float(parse_qs(url.query).get("seconds", ["60"])[0]))
            return self.answer(201, {"slow": True})
        if url.path == "/fail":
            record(url.path, None, key, tenant)
            return self.answer(500, {"error": "failed"})
        if url.path == "/switch":
            # A backend that switches protocols though nobody asked.
            record(url.path, None, key, tenant)
            self.send_response(101)
            self.send_header("upgrade", "websocket")
            self.send_header("connection", "upgrade")
            self.end_headers()
            self.close_connection = True
            return None
        if url.path == "/mcp":
            return self.mcp(raw, key, tenant)
        if url.path != "/payments":
            return self.answer(404, {"error": "not found"})
        try:
            payment = json.loads(raw, object_pairs_hook=no_duplicates)
        except ValueError:
            return self.answer(400, {"error": "invalid JSON"})
        except (RecursionError, DuplicateKey):
            return self.answer(422, {"error": "not a payment"})
        if not isinstance(payment, dict) or not isinstance(payment.get("amount"), int):
            return self.answer(422, {"error": "not a payment"})
        row = record(url.path, payment["amount"], key, tenant)
        return self.answer(201, {"id": row, "amount": payment["amount"], "tenant": tenant})


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # Clients that hang up (the tests reset connections) are expected.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main():
    host, port = os.environ.get("LISTEN", "127.0.0.1:8000").rsplit(":", 1)
    conn = sqlite3.connect(DB)
    conn.execute(
        "create table if not exists payments (id integer primary key, path text, amount integer, idempotency_key text, tenant text)"
    )
    conn.commit()
    conn.close()
    server = Server((host, int(port)), Handler)
    sys.setrecursionlimit(2000)
    server.serve_forever()


if __name__ == "__main__":
    main()
