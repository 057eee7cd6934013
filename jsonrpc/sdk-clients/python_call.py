"""Calls `send_email` once through an MCP server with the official MCP
Python SDK (`mcp` on PyPI), in one session, and retries it on that session
(the same arguments, so the same key) while it fails, up to RETRIES times.

    python_call.py URL ARGUMENTS_JSON [TIMEOUT_SECONDS [RETRIES]]

Prints one JSON line per attempt: {"error": {"code", "message", "data"}}
for a JSON-RPC error the SDK raised (what an agent reads), {"failure": ...}
for any other exception, or {"text", "replayed"} for a result. Exits 0.
"""

import asyncio
import json
import sys

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


async def main() -> int:
    url, arguments = sys.argv[1], json.loads(sys.argv[2])
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    retries = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    headers = {"Authorization": "Bearer python-sdk"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write, read_timeout_seconds=30) as session:
                await session.initialize()
                for attempt in range(retries + 1):
                    try:
                        result = await session.call_tool("send_email", arguments, read_timeout_seconds=timeout)
                    except MCPError as error:
                        line = {"error": {"code": error.code, "message": error.message, "data": error.data}}
                    except Exception as error:  # noqa: BLE001 - reported, not hidden
                        line = {"failure": f"{type(error).__name__}: {error}"}
                    else:
                        meta = result.meta or {}
                        line = {
                            "text": result.content[0].text,
                            "is_error": result.is_error,
                            "replayed": bool(meta.get("io.idempotency/replayed")),
                        }
                    print(json.dumps(line), flush=True)
                    if "text" in line:
                        break
                    if attempt < retries:
                        await asyncio.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
