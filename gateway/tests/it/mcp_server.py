"""An MCP server in another language, for the gateway's `jsonrpc` routes.

Built on the official MCP Python SDK (`mcp` on PyPI; its `MCPServer`, the
FastMCP of mcp 1.x), served over Streamable HTTP at /mcp on $LISTEN
(host:port). Run it with the Python of the venv `scripts/mcp-sdk-clients`
installs (jsonrpc/sdk-clients/.venv).

  send_email(to, subject, body, idempotency_key)   appends `to|subject` to
      the file $OUTBOX (one line per email sent) and answers
      "sent email #N to TO (SUBJECT)", N counting this process's emails
  sent_emails()                                    read-only: how many lines $OUTBOX has
  GET /healthz                                     200 {"status":"ok"}

$MCP_STATELESS=1 serves without sessions (each POST stands alone);
$MCP_JSON_RESPONSE=1 answers calls as JSON instead of an event stream;
$SEND_DELAY_MS (default 50) is how long send_email works before it writes.
"""

import asyncio
import os

from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse

OUTBOX = os.environ["OUTBOX"]
HOST, PORT = os.environ["LISTEN"].rsplit(":", 1)
DELAY = int(os.environ.get("SEND_DELAY_MS", "50")) / 1000
SENT = 0

server = MCPServer("python-email", log_level="WARNING")


@server.tool(description="Send an email. Pass idempotency_key and reuse it on retries.")
async def send_email(to: str, subject: str, body: str = "", idempotency_key: str | None = None) -> str:
    global SENT
    # A little work, so that concurrent retries overlap the first call.
    await asyncio.sleep(DELAY)
    with open(OUTBOX, "a", encoding="utf-8") as outbox:
        outbox.write(f"{to}|{subject}\n")
    SENT += 1
    return f"sent email #{SENT} to {to} ({subject})"


@server.tool(description="How many emails were sent (read-only).")
async def sent_emails() -> str:
    try:
        with open(OUTBOX, encoding="utf-8") as outbox:
            return str(sum(1 for _ in outbox))
    except FileNotFoundError:
        return "0"


@server.custom_route("/healthz", methods=["GET"])
async def healthz(_request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


if __name__ == "__main__":
    server.run(
        "streamable-http",
        host=HOST,
        port=int(PORT),
        stateless_http=os.environ.get("MCP_STATELESS") == "1",
        json_response=os.environ.get("MCP_JSON_RESPONSE") == "1",
    )
