// Drives the operators' console in headless Chromium (Debian's
// /usr/bin/chromium, through playwright-core: nothing is downloaded).
// Run by service/tests/it/console.rs against a real service; prints one
// JSON object of what it saw on stdout, which the Rust test asserts on.
//
// Environment: BASE_URL, SCOPE, TOKEN_A (an admin of SCOPE and
// SCAN_SCOPE), TOKEN_B (an admin of tenant-b only), KEY (an abandoned key
// of SCOPE), XSS_KEY (a key of SCOPE holding markup), REASON, SCAN_SCOPE
// (a scope whose SCAN_PATH records come after more than one listing
// request's worth of others), SCAN_PATH, and SCREENSHOTS (a folder: when
// set, the list and the key's page are saved there as PNGs, and the
// phone-sized ones too).
import http from "node:http";
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
const tokenA = env("TOKEN_A");
const scanScope = env("SCAN_SCOPE");
const scanPath = env("SCAN_PATH");
// A key the completer will finish (empty on a store that keeps no steps).
const resumingKey = process.env.RESUMING_KEY || "";
const COOKIE = "idempotency-console";

// A plain HTTP request, outside the browser: the status, content type
// and body.
const raw = (method, path, headers) => new Promise((resolve, reject) => {
  const request = http.request(`${base}${path}`, { method, headers }, (response) => {
    let body = "";
    response.setEncoding("utf8");
    response.on("data", (chunk) => { body += chunk; });
    response.on("end", () => resolve({ status: response.statusCode, type: response.headers["content-type"] || "", body }));
  });
  request.on("error", reject);
  request.end();
});

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const seen = { dialogs: [], pageErrors: [], cspViolations: [] };
try {
  const context = await browser.newContext({ viewport: { width: 1100, height: 640 }, acceptDownloads: true });
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
  // The key page's decisions (its audit trail), newest first: the cells'
  // text of each row, and how many elements the cells hold (none: text).
  const trailSeen = async () => ({
    rows: await page.$$eval("#k-trail tbody tr:not(.empty)", (rows) =>
      rows.map((row) => [...row.cells].map((cell) => cell.textContent))),
    elements: await page.$$eval("#k-trail tbody td *", (nodes) => nodes.length),
  });
  // The list shown and read to its end (both tables no longer busy).
  const listed = async (on = page) => {
    await on.waitForSelector("#list:not([hidden])");
    await on.waitForFunction(() => ["needs", "rest"].every((id) => document.getElementById(id).getAttribute("aria-busy") === "false"));
  };
  const signIn = async (token, on = page) => {
    await on.waitForSelector("#login:not([hidden])");
    await on.fill("#token", token);
    await on.click("#login-form button[type=submit]");
    await on.waitForSelector("#who:not([hidden])");
    await listed(on);
  };
  const sessionCookie = async () => (await context.cookies()).find((cookie) => cookie.name === COOKIE);

  // Sign in as tenant-a's admin: the keys that need a decision come first.
  const first = await page.goto(`${base}/console`);
  seen.csp = first.headers()["content-security-policy"] || null;
  await signIn(tokenA);
  // The token is nowhere in the page: not in its storage, its DOM, its
  // fields or its cookies; the session cookie is out of the script's reach.
  seen.tokenKept = await page.evaluate((token) => {
    const places = [
      JSON.stringify({ ...sessionStorage }),
      JSON.stringify({ ...localStorage }),
      document.documentElement.outerHTML,
      document.cookie,
      ...[...document.querySelectorAll("input, textarea")].map((field) => field.value),
    ];
    return places.filter((place) => place.includes(token)).length;
  }, tokenA);
  seen.storageKeys = await page.evaluate(() => [...Object.keys(sessionStorage), ...Object.keys(localStorage)]);
  seen.scriptCookies = await page.evaluate(() => document.cookie);
  const cookie = await sessionCookie();
  seen.cookie = cookie ? { httpOnly: cookie.httpOnly, sameSite: cookie.sameSite, secure: cookie.secure, path: cookie.path, holdsToken: cookie.value.includes(tokenA) } : null;
  const cookieHeader = cookie ? `${COOKIE}=${cookie.value}` : "";
  // Outside the browser: the cookie reads; a write with a foreign or no
  // Origin is refused; with the console's own it goes through (here to a
  // key that does not exist).
  const write = `/v1/admin/keys/${encodeURIComponent(scope)}/no-such-key/reconcile?reason=${encodeURIComponent("forged from another site")}`;
  seen.replay = {
    read: await raw("GET", "/v1/admin/whoami", { cookie: cookieHeader }),
    foreign: await raw("POST", write, { cookie: cookieHeader, origin: "http://evil.example" }),
    noOrigin: await raw("POST", write, { cookie: cookieHeader }),
    sameOrigin: await raw("POST", write, { cookie: cookieHeader, origin: new URL(base).origin }),
  };
  seen.who = await page.textContent("#who-name");
  seen.scope = await page.inputValue("#f-scope");
  seen.needsBefore = await keyTexts("needs");
  seen.restBefore = await keyTexts("rest");
  // The key holding markup is shown as text: no element made of it, no
  // script run.
  seen.xssRendered = await page.$$eval("#needs tbody td.key a", (links, text) =>
    links.some((link) => link.textContent === text && link.children.length === 0), xssKey);
  seen.injectedElements = await page.$$eval("main script, main img, main iframe", (nodes) => nodes.length);
  seen.pwned = await page.evaluate(() => window.__pwned ?? null);
  if (shots) await page.screenshot({ path: `${shots}/console-list.png` });

  // A key that will complete: listed apart with its badge; its page shows
  // its steps, and it may still be released.
  if (resumingKey) {
    const row = `#rest tbody tr[data-key="${resumingKey}"]`;
    seen.resuming = { listBadge: await page.textContent(`${row} td[data-label="State"]`) };
    await page.click(`${row} td.key a`);
    await page.waitForFunction((text) => document.getElementById("k-key").textContent === text && !document.getElementById("actions").hidden, resumingKey);
    seen.resuming.badge = await page.textContent("#k-badge");
    seen.resuming.steps = await page.$$eval("#k-request ol.steps li", (items) => items.map((item) => item.textContent));
    seen.resuming.request = await page.textContent("#k-request");
    seen.resuming.releaseEnabled = await page.isEnabled("#act-release");
    seen.resuming.reconcileEnabled = await page.isEnabled("#act-reconcile");
    seen.resuming.giveUpEnabled = await page.isEnabled("#act-give-up");
    await page.click("#back");
    await listed();
  }

  // Open the abandoned key.
  await page.click(`#needs tbody tr[data-key="${key}"] td.key a`);
  await page.waitForFunction((text) => document.getElementById("k-key").textContent === text && !document.getElementById("actions").hidden, key);
  seen.keyPage = {
    key: await page.textContent("#k-key"),
    scope: await page.textContent("#k-scope"),
    badge: await page.textContent("#k-badge"),
    life: await page.$$eval("#k-life li", (items) => items.map((item) => item.textContent)),
    request: await page.textContent("#k-request"),
    response: await page.textContent("#k-response"),
    releaseEnabled: await page.isEnabled("#act-release"),
    giveUpEnabled: await page.isEnabled("#act-give-up"),
  };
  if (shots) await page.screenshot({ path: `${shots}/console-key.png`, fullPage: true });

  // Release without a reason: refused in the page; with one: done.
  await page.click("#act-release");
  seen.noReason = await page.textContent("#message");
  await page.fill("#reason", reason);
  await page.click("#act-release");
  await page.waitForFunction(() => /Released/.test(document.getElementById("message").textContent));
  seen.released = await page.textContent("#message");
  // The record is gone; its page lists the release among its decisions.
  await page.waitForSelector('#k-trail tbody tr[data-action="release"]');
  seen.trailAfterRelease = await trailSeen();

  // Back to the list: the released key is gone from it.
  await page.click("#back");
  await listed();
  seen.needsAfter = await keyTexts("needs");

  // The key holding markup, on its own page, is text too.
  await page.locator("#needs tbody td.key a").filter({ hasText: xssKey }).first().click();
  await page.waitForFunction((text) => document.getElementById("k-key").textContent === text && !document.getElementById("actions").hidden, xssKey);
  seen.xssKeyPage = await page.textContent("#k-key");
  seen.pwnedAfter = await page.evaluate(() => window.__pwned ?? null);

  // A completed debit's page: its stored answer, redacted.
  await page.click("#back");
  await listed();
  await page.click('#rest tbody tr[data-key="debit-0003"] td.key a');
  await page.waitForFunction(() => document.getElementById("k-key").textContent === "debit-0003" && !document.getElementById("actions").hidden);
  seen.answerPage = {
    response: await page.textContent("#k-response"),
    headers: await page.textContent("#k-headers"),
    body: await page.textContent("#k-body"),
    bold: await page.$$eval("#k-body b, #k-headers b", (nodes) => nodes.length),
  };
  if (shots) await page.screenshot({ path: `${shots}/console-answer.png`, fullPage: true });

  // Finance's CSV.
  await page.click("#back");
  await listed();
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#export")]);
  const stream = await download.createReadStream();
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  seen.csv = Buffer.concat(chunks).toString("utf8");

  // Mark the key holding markup reconciled: kept, no longer needing a
  // decision; then forget a completed key.
  await page.locator("#needs tbody td.key a").filter({ hasText: xssKey }).first().click();
  await page.waitForFunction((text) => document.getElementById("k-key").textContent === text && !document.getElementById("actions").hidden, xssKey);
  await page.fill("#reason", "customer confirmed one debit; keep the record");
  await page.click("#act-reconcile");
  await page.waitForFunction(() => /Marked/.test(document.getElementById("message").textContent));
  await page.waitForFunction(() => /Reconciled by/.test(document.getElementById("k-badge").textContent));
  seen.reconciledBadge = await page.textContent("#k-badge");
  seen.reconciledLife = await page.$$eval("#k-life li", (items) => items.map((item) => item.textContent));
  await page.click("#back");
  await listed();
  seen.needsReconciled = await page.textContent("#needs tbody");
  seen.restReconciled = await keyTexts("rest");
  await page.click('#rest tbody tr[data-key="debit-0001"] td.key a');
  await page.waitForFunction(() => document.getElementById("k-key").textContent === "debit-0001" && !document.getElementById("actions").hidden);
  await page.fill("#reason", "test debit, replay no longer wanted");
  await page.click("#act-forget");
  await page.waitForFunction(() => /Forgot/.test(document.getElementById("message").textContent));
  seen.forgot = await page.textContent("#message");

  // A filter whose matches come after more records than one listing
  // request reads: the list follows `next` by itself, shows its progress,
  // and never says "nothing" before the end.
  await page.click("#back");
  await listed();
  await page.evaluate(() => {
    window.__drawn = { needs: [], rest: [] };
    for (const id of ["needs", "rest"]) {
      const body = document.querySelector(`#${id} tbody`);
      new MutationObserver(() => window.__drawn[id].push(body.textContent))
        .observe(body, { childList: true, subtree: true, characterData: true });
    }
  });
  await page.fill("#f-scope", scanScope);
  await page.fill("#f-path", scanPath);
  await page.click("#filters button[type=submit]");
  await listed();
  seen.scan = {
    needs: await keyTexts("needs"),
    rest: await page.textContent("#rest tbody"),
    drawn: await page.evaluate(() => window.__drawn),
    pagerButtons: await page.$$eval("#needs-pager button, #rest-pager button", (buttons) => buttons.length),
  };
  await page.fill("#f-path", "");

  // Signing out ends the session on the server: the old cookie, replayed,
  // is refused.
  await page.click("#sign-out");
  await page.waitForSelector("#login:not([hidden])");
  seen.signedOut = {
    replay: await raw("GET", "/v1/admin/whoami", { cookie: cookieHeader }),
    cookieLeft: Boolean(await sessionCookie()),
  };

  // An admin of tenant-b sees nothing of tenant-a.
  await signIn(env("TOKEN_B"));
  seen.other = {
    who: await page.textContent("#who-name"),
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

  // On a phone (375 px wide), no page is wider than the screen, and the
  // key's page stacks its columns.
  const phone = await browser.newContext({ viewport: { width: 375, height: 740 }, isMobile: true, hasTouch: true });
  const small = await phone.newPage();
  small.setDefaultTimeout(15000);
  small.on("pageerror", (error) => seen.pageErrors.push(String(error)));
  const width = () => small.evaluate(() => document.scrollingElement.scrollWidth);
  seen.phone = {};
  await small.goto(`${base}/console`);
  await small.waitForSelector("#login:not([hidden])");
  seen.phone.login = await width();
  await signIn(tokenA, small);
  seen.phone.list = await width();
  if (shots) await small.screenshot({ path: `${shots}/console-phone-list.png`, fullPage: true });
  await small.fill("#f-scope", scanScope);
  await small.click("#filters button[type=submit]");
  await listed(small);
  seen.phone.scanList = await width();
  for (const [name, opened] of [["keyPage", xssKey], ["answerPage", "debit-0003"]]) {
    await small.goto(`${base}/console#/key/${encodeURIComponent(scope)}/${encodeURIComponent(opened)}`);
    await small.waitForFunction((text) => document.getElementById("k-key").textContent === text && !document.getElementById("actions").hidden, opened);
    seen.phone[name] = await width();
    if (shots) await small.screenshot({ path: `${shots}/console-phone-${name}.png`, fullPage: true });
  }
  seen.phone.stacked = await small.$$eval(".columns > div", ([left, right]) =>
    right.getBoundingClientRect().top >= left.getBoundingClientRect().bottom);
  await phone.close();
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
