// Calls `send_email` once through an MCP server with the official MCP
// TypeScript SDK (`@modelcontextprotocol/sdk` on npm), in one session, and
// retries it on that session (the same arguments, so the same key) while it
// fails, up to RETRIES times.
//
//     node typescript_call.mjs URL ARGUMENTS_JSON [TIMEOUT_SECONDS [RETRIES]]
//
// Prints one JSON line per attempt: {"error": {"code", "message", "data"}}
// for a JSON-RPC error the SDK raised (what an agent reads), {"failure": ...}
// for any other error, or {"text", "replayed"} for a result. Exits 0.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";

const [url, argumentsJson] = [process.argv[2], process.argv[3]];
const timeout = Number(process.argv[4] ?? 10) * 1000;
const retries = Number(process.argv[5] ?? 0);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: "Bearer typescript-sdk" } },
});
const client = new Client({ name: "idempotency-test", version: "1.0.0" });
await client.connect(transport, { timeout: 30000 });
for (let attempt = 0; attempt <= retries; attempt++) {
  let line;
  try {
    const result = await client.callTool(
      { name: "send_email", arguments: JSON.parse(argumentsJson) },
      undefined,
      { timeout },
    );
    line = {
      text: result.content[0].text,
      is_error: result.isError === true,
      replayed: result._meta?.["io.idempotency/replayed"] === true,
    };
  } catch (error) {
    line = error instanceof McpError
      ? { error: { code: error.code, message: error.message, data: error.data ?? null } }
      : { failure: String(error) };
  }
  console.log(JSON.stringify(line));
  if ("text" in line) break;
  if (attempt < retries) await new Promise((resolve) => setTimeout(resolve, 500));
}
await client.close().catch(() => {});
process.exit(0);
