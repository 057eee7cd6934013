// Sends N emails through an MCP server with the official MCP TypeScript SDK
// (`@modelcontextprotocol/sdk` on npm), each with its own idempotency key,
// retrying every call (a new connection each time) until it is answered.
//
//     node typescript_client.mjs URL N
//
// Prints one JSON line per email: its index, the result's text, whether the
// answer was a replay, and how many attempts it took. Exits non-zero when an
// email is still unanswered after its attempts.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const ATTEMPTS = 30;

async function attempt(url, index) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: "Bearer typescript-sdk" } },
    reconnectionOptions: { maxRetries: 0, initialReconnectionDelay: 1000, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1 },
  });
  const client = new Client({ name: "idempotency-test", version: "1.0.0" });
  try {
    await client.connect(transport, { timeout: 5000 });
    const result = await client.callTool(
      {
        name: "send_email",
        arguments: {
          to: `user${index}@example.com`,
          subject: `typescript ${index}`,
          body: "hello",
          idempotency_key: `typescript-email-${index}`,
        },
      },
      undefined,
      { timeout: 5000 },
    );
    return {
      index,
      text: result.content[0].text,
      is_error: result.isError === true,
      replayed: result._meta?.["io.idempotency/replayed"] === true,
    };
  } finally {
    await client.close().catch(() => {});
  }
}

async function main() {
  const [url, count] = [process.argv[2], Number(process.argv[3])];
  for (let index = 0; index < count; index++) {
    let answered = false;
    for (let tries = 1; tries <= ATTEMPTS && !answered; tries++) {
      try {
        const answer = await attempt(url, index);
        answer.attempts = tries;
        console.log(JSON.stringify(answer));
        answered = true;
      } catch (error) {
        // A dropped answer: retry, same key.
        console.error(`email ${index} attempt ${tries}: ${error}`);
      }
    }
    if (!answered) {
      console.error(`email ${index}: no answer after ${ATTEMPTS} attempts`);
      return 1;
    }
  }
  return 0;
}

process.exit(await main());
