// Drives the operators' console in headless Chromium over what an
// incident lab run left (lab/tests/it/console.rs runs it against the
// lab's kept store): the abandoned keys of the crash listed first, one
// of them opened and released with a reason; a key holding markup shown
// as text; an admin of another scope seeing none of it. Prints one JSON
// object of what it saw on stdout, which the Rust test asserts on.
//
// Environment: BASE_URL, SCOPE, TOKEN_A (an admin of SCOPE), TOKEN_B (an
// admin of tenant-b only), KEY (an abandoned key of the lab run, in
// SCOPE), XSS_KEY (a key of SCOPE holding markup), REASON, and
// SCREENSHOTS (a folder: when set, the list and the key's page are saved
// there as lab-console-list.png and lab-console-key.png).
import { chromium } from "playwright-core";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const base = env("BASE_URL");
const scope = env("SCOPE");
const key = env("KEY");
const xssKey = env("XSS_KEY");
const reason = env("REASON");
const shots = process.env.SCREENSHOTS;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const seen = { dialogs: [], pageErrors: [], cspViolations: [] };
try {
  const context = await browser.newContext({ viewport: { width: 1100, height: 640 } });
  const page = await context.newPage();
  page.setDefaultTimeout(15000);
  page.on("dialog", async (dialog) => {
    seen.dialogs.push(dialog.message());
    await dialog.dismiss();
  });
  page.on("pageerror", (error) => seen.pageErrors.push(String(error)));
  page.on("console", (message) => {
    if (/Content Security Policy/i.test(message.text())) seen.cspViolations.push(message.text());
  });

  const keyTexts = (table) =>
    page.$$eval(`#${table} tbody td.key`, (cells) => cells.map((cell) => cell.textContent));
  // The list shown and read to its end (both tables no longer busy).
  const listed = async () => {
    await page.waitForSelector("#list:not([hidden])");
    await page.waitForFunction(() => ["needs", "rest"].every((id) => document.getElementById(id).getAttribute("aria-busy") === "false"));
  };
  const signIn = async (token) => {
    await page.waitForSelector("#login:not([hidden])");
    await page.fill("#token", token);
    await page.click("#login-form button[type=submit]");
    await page.waitForSelector("#who:not([hidden])");
    await listed();
  };
  const openKey = async (text) => {
    await page.locator("#needs tbody td.key a").filter({ hasText: text }).first().click();
    await page.waitForFunction((wanted) => document.getElementById("k-key").textContent === wanted && !document.getElementById("actions").hidden, text);
  };

  // Sign in as the lab scope's admin: the keys that need a decision first.
  await page.goto(`${base}/console`);
  await signIn(env("TOKEN_A"));
  seen.scope = await page.inputValue("#f-scope");
  seen.needsBefore = await keyTexts("needs");
  seen.restBefore = await keyTexts("rest");
  seen.xssRendered = await page.$$eval("#needs tbody td.key a", (links, text) =>
    links.some((link) => link.textContent === text && link.children.length === 0), xssKey);
  seen.injectedElements = await page.$$eval("main script, main img, main iframe", (nodes) => nodes.length);
  seen.pwned = await page.evaluate(() => window.__pwned ?? null);
  if (shots) await page.screenshot({ path: `${shots}/lab-console-list.png` });

  // The lab's abandoned key: its life and its request.
  await openKey(key);
  seen.keyPage = {
    key: await page.textContent("#k-key"),
    badge: await page.textContent("#k-badge"),
    life: await page.$$eval("#k-life li", (items) => items.map((item) => item.textContent)),
    request: await page.textContent("#k-request"),
    releaseEnabled: await page.isEnabled("#act-release"),
  };
  if (shots) await page.screenshot({ path: `${shots}/lab-console-key.png`, fullPage: true });

  // Release: refused without a reason, done with one.
  await page.click("#act-release");
  seen.noReason = await page.textContent("#message");
  await page.fill("#reason", reason);
  await page.click("#act-release");
  await page.waitForFunction(() => /Released/.test(document.getElementById("message").textContent));
  seen.released = await page.textContent("#message");

  // Back to the list: the released key is gone from it.
  await page.click("#back");
  await listed();
  seen.needsAfter = await keyTexts("needs");

  // The key holding markup, on its own page, is text too.
  await openKey(xssKey);
  seen.xssKeyPage = await page.textContent("#k-key");
  seen.pwnedAfter = await page.evaluate(() => window.__pwned ?? null);

  // An admin of tenant-b sees nothing of the lab's scope.
  await page.click("#sign-out");
  await signIn(env("TOKEN_B"));
  seen.other = {
    scope: await page.inputValue("#f-scope"),
    needs: await keyTexts("needs"),
    rest: await keyTexts("rest"),
  };
  await page.fill("#f-scope", scope);
  await page.click("#filters button[type=submit]");
  await page.waitForSelector("#message.error");
  seen.other.forcedScope = await page.textContent("#message");
  seen.other.forcedRows = await keyTexts("needs");
  await page.goto("about:blank");
  await page.goto(`${base}/console#/key/${encodeURIComponent(scope)}/${encodeURIComponent(key)}`);
  await page.waitForSelector("#message.error");
  seen.other.forcedKey = await page.textContent("#message");
  seen.other.forcedKeyShown = await page.textContent("#k-key");
  seen.other.page = await page.textContent("main");
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
