"""Sends N emails through an MCP server with the official MCP Python SDK
(`mcp` on PyPI), all at once, each with its own idempotency key, retrying every call
(a new connection and session each time) until it is answered.

    python_client.py URL N

Prints one JSON line per email: its index, the result's text, whether the
answer was a replay, and how many attempts it took. Exits non-zero when an
email is still unanswered after its attempts.
"""

import asyncio
import json
import sys

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

ATTEMPTS = 30
# The server is local and answers in milliseconds: after 2 s an answer was
# dropped (or cut), and the call is retried with the same key.
READ_TIMEOUT = 2


async def attempt(url: str, index: int) -> dict | None:
    headers = {"Authorization": "Bearer python-sdk"}
    async with httpx2.AsyncClient(headers=headers, timeout=10) as http:
        async with streamable_http_client(url, http_client=http, terminate_on_close=False) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT) as session:
                await session.initialize()
                result = await session.call_tool(
                    "send_email",
                    {
                        "to": f"user{index}@example.com",
                        "subject": f"python {index}",
                        "body": "hello",
                        "idempotency_key": f"python-email-{index}",
                    },
                    read_timeout_seconds=READ_TIMEOUT,
                )
                meta = result.meta or {}
                return {
                    "index": index,
                    "text": result.content[0].text,
                    "is_error": result.is_error,
                    "replayed": bool(meta.get("io.idempotency/replayed")),
                }


async def send(url: str, index: int) -> dict | None:
    """One email: its call, retried with the same key until answered."""
    for tries in range(1, ATTEMPTS + 1):
        try:
            answer = await asyncio.wait_for(attempt(url, index), timeout=3 * READ_TIMEOUT)
        except BaseException as error:  # a dropped answer: retry, same key
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            print(f"email {index} attempt {tries}: {type(error).__name__}: {error}", file=sys.stderr)
            continue
        if answer is None:
            # The SDK's task group took a cut answer's error as its own
            # cancellation and absorbed it: the call ended without a
            # result. Retry, same key.
            print(f"email {index} attempt {tries}: ended without a result", file=sys.stderr)
            continue
        answer["attempts"] = tries
        return answer
    print(f"email {index}: no answer after {ATTEMPTS} attempts", file=sys.stderr)
    return None


async def main() -> int:
    url, count = sys.argv[1], int(sys.argv[2])
    # Every email at once (each with its own key), answers printed in order.
    answers = await asyncio.gather(*(send(url, index) for index in range(count)))
    for answer in answers:
        if answer is None:
            return 1
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
