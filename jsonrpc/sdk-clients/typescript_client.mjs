// Sends N emails through an MCP server with the official MCP TypeScript SDK
// (`@modelcontextprotocol/sdk` on npm), all at once, each with its own idempotency key,
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
// The server is local and answers in milliseconds: after 2 s an answer was
// dropped (or cut), and the call is retried with the same key.
const READ_TIMEOUT_MS = 2000;

async function attempt(url, index) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: "Bearer typescript-sdk" } },
    reconnectionOptions: { maxRetries: 0, initialReconnectionDelay: 1000, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1 },
  });
  const client = new Client({ name: "idempotency-test", version: "1.0.0" });
  try {
    await client.connect(transport, { timeout: READ_TIMEOUT_MS });
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
      { timeout: READ_TIMEOUT_MS },
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

// One email: its call, retried with the same key until answered.
async function send(url, index) {
  for (let tries = 1; tries <= ATTEMPTS; tries++) {
    try {
      const answer = await attempt(url, index);
      answer.attempts = tries;
      return answer;
    } catch (error) {
      // A dropped answer: retry, same key.
      console.error(`email ${index} attempt ${tries}: ${error}`);
    }
  }
  console.error(`email ${index}: no answer after ${ATTEMPTS} attempts`);
  return null;
}

async function main() {
  const [url, count] = [process.argv[2], Number(process.argv[3])];
  // Every email at once (each with its own key), answers printed in order.
  const answers = await Promise.all(Array.from({ length: count }, (_, index) => send(url, index)));
  for (const answer of answers) {
    if (answer === null) return 1;
    console.log(JSON.stringify(answer));
  }
  return 0;
}

process.exit(await main());
