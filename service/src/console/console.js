// The operators' console. Every datum comes from the admin API, called
// with the session cookie that signing in exchanged the admin token for
// (HttpOnly: this script never sees it, and keeps no token), and is put
// in the page as text (textContent), never as markup.
"use strict";

const PAGE = 50;
// Where an earlier console kept the token: removed on sight.
const OLD_TOKEN = "idempotency-console-token";
const $ = (id) => document.getElementById(id);

// An element with text children only: strings become text nodes.
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function say(text, error) {
  const message = $("message");
  message.textContent = text;
  message.className = error ? "error" : "";
  message.hidden = !text;
}

class ApiError extends Error {
  constructor(status, problem) {
    super(problem && (problem.detail || problem.title) ? `${problem.title || status}: ${problem.detail || ""}` : `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

async function refusal(response) {
  let problem = null;
  try { problem = await response.json(); } catch (_) { /* not JSON */ }
  return new ApiError(response.status, problem);
}

// Calls the admin API with the session cookie (sent by the browser).
async function api(method, path, params, raw) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") query.set(name, value);
  }
  const url = path + (query.toString() ? `?${query}` : "");
  const response = await fetch(url, { method, credentials: "same-origin" });
  if (!response.ok) throw await refusal(response);
  return raw ? response : response.json();
}

const seg = encodeURIComponent;

// ---- sign in / out

let identity = null;

function showIdentity() {
  $("who-name").textContent = `${identity.name} (scopes: ${identity.scopes.join(", ")})`;
  $("who").hidden = false;
  const list = $("scopes");
  clear(list);
  for (const scope of identity.scopes) {
    if (scope !== "*") list.append(el("option", { value: scope }));
  }
  if (identity.scopes[0] !== "*" && !identity.scopes.includes($("f-scope").value)) {
    $("f-scope").value = identity.scopes[0];
  }
}

// Sends the admin token once: the service answers who signed in and sets
// the session cookie. The token is not kept anywhere.
async function signIn(token) {
  const response = await fetch("/v1/admin/session", {
    method: "POST",
    headers: { authorization: `Bearer ${token}` },
    credentials: "same-origin",
  });
  if (!response.ok) throw await refusal(response);
  identity = await response.json();
  showIdentity();
}

// Ends the session on the server, then here.
async function signOut() {
  let why = "";
  try {
    const response = await fetch("/v1/admin/session", { method: "DELETE", credentials: "same-origin" });
    if (!response.ok && response.status !== 401) why = `Signing out failed (${(await refusal(response)).message}): the session ends once idle.`;
  } catch (error) {
    why = `Signing out failed (${error.message}): the session ends once idle.`;
  }
  signedOut(why);
}

// Forgets who signed in and shows the sign-in form.
function signedOut(why) {
  identity = null;
  listRun += 1;
  $("who").hidden = true;
  current = null;
  $("f-scope").value = "";
  for (const id of ["needs", "rest"]) {
    clear($(id).tBodies[0]);
    $(id).removeAttribute("aria-busy");
  }
  for (const id of ["needs-pager", "rest-pager"]) clear($(id));
  // The next sign-in starts at the list, not at this session's last key.
  history.replaceState(null, "", location.pathname);
  show("login");
  say(why || "", Boolean(why));
}

function show(section) {
  for (const id of ["login", "list", "key"]) $(id).hidden = id !== section;
}

// ---- the lists

// Bumped whenever the lists are drawn anew or left: an older scan stops.
let listRun = 0;

function filters() {
  const iso = (value) => (value ? new Date(value).toISOString() : "");
  return {
    scope: $("f-scope").value.trim(),
    method: $("f-method").value.trim(),
    path_prefix: $("f-path").value.trim(),
    created_after: iso($("f-after").value),
    created_before: iso($("f-before").value),
  };
}

function keyLink(record) {
  const link = el("a", { text: record.key });
  link.href = `#/key/${seg(record.scope)}/${seg(record.key)}`;
  return link;
}

function attempts(n) {
  return `${n} ${n === 1 ? "attempt" : "attempts"}`;
}

function stateBadge(record) {
  const name = record.reconciled ? "reconciled"
    : record.will_complete ? "will_complete"
    : record.completer && record.completer.gave_up && record.state === "abandoned" ? "gave_up"
    : record.state;
  return el("span", { class: `state state-${name}`, text: name.replace("_", " ") });
}

function when(at) {
  return at ? at.replace("T", " ").replace(/\.\d+/, "").replace("Z", " UTC") : "";
}

function noteRow(text, kind) {
  return el("tr", { class: kind }, el("td", { colspan: "5", text }));
}

// A table of the records that pass `query`, PAGE at a time. The admin
// API reads a bounded number of records per request, so with filters it
// may answer a short or empty page with a `next`: a page here follows
// `next` until it holds PAGE records or the range is read to its end,
// showing what it found and how far it read meanwhile (`aria-busy` on the
// table), and says `emptyText` only once the whole range was read.
function pagedTable(tableId, pagerId, query, row, emptyText, run) {
  const table = $(tableId);
  const starts = [undefined]; // the `after` of each page shown so far
  async function load() {
    if (run !== listRun) return;
    const body = table.tBodies[0];
    const pager = $(pagerId);
    clear(pager);
    const found = [];
    let read = 0;
    let after = starts[starts.length - 1];
    let next = null;
    const draw = (note) => {
      clear(body);
      for (const record of found.slice(0, PAGE)) body.append(row(record));
      if (note) body.append(note);
    };
    table.setAttribute("aria-busy", "true");
    draw(noteRow("Scanning…", "progress"));
    try {
      for (;;) {
        const page = await api("GET", "/v1/admin/keys", { ...query, limit: PAGE, after });
        if (run !== listRun) return;
        read += page.scanned || page.records.length;
        found.push(...page.records);
        if (found.length > PAGE) {
          next = found[PAGE - 1].key;
          break;
        }
        if (found.length === PAGE || !page.next) {
          next = page.next || null;
          break;
        }
        after = page.next;
        const matches = `${found.length} ${found.length === 1 ? "match" : "matches"}`;
        draw(noteRow(`Scanning… ${read} records read, ${matches} so far.`, "progress"));
      }
    } catch (error) {
      if (run !== listRun) return;
      draw(noteRow(`Stopped after ${read} records read: ${error.message}`, "empty"));
      table.setAttribute("aria-busy", "false");
      throw error;
    }
    draw(found.length ? null : noteRow(emptyText, "empty"));
    table.setAttribute("aria-busy", "false");
    if (starts.length > 1) {
      const previous = el("button", { type: "button", text: "Previous page" });
      previous.addEventListener("click", () => { starts.pop(); load().catch(fail); });
      pager.append(previous);
    }
    if (next) {
      const more = el("button", { type: "button", text: "Next page" });
      more.addEventListener("click", () => { starts.push(next); load().catch(fail); });
      pager.append(more);
    }
  }
  return load();
}

async function showList() {
  show("list");
  const run = ++listRun;
  const base = filters();
  for (const id of ["needs", "rest"]) {
    clear($(id).tBodies[0]);
    $(id).removeAttribute("aria-busy");
  }
  for (const id of ["needs-pager", "rest-pager"]) clear($(id));
  if (!base.scope) {
    say("Choose a scope.", false);
    return;
  }
  say("");
  const state = $("f-state").value;
  const needsState = state === "any" || state === "abandoned";
  const scans = [];
  if (needsState) {
    scans.push(pagedTable("needs", "needs-pager", { ...base, needs_decision: "true" }, (record) =>
      el("tr", { "data-key": record.key },
        el("td", { class: "key" }, keyLink(record)),
        el("td", { "data-label": "State" }, stateBadge(record)),
        el("td", { "data-label": "Request" }, el("code", { text: `${record.method} ${record.path}` })),
        el("td", { "data-label": "Claimed", text: when(record.created_at) }),
        el("td", { "data-label": "Lease ended", text: when(record.lease_expires_at) })),
      "Nothing needs a decision.", run));
  } else {
    $("needs").tBodies[0].append(noteRow(`Not shown: the state filter is ${state}.`, "empty"));
    $("needs").setAttribute("aria-busy", "false");
  }
  scans.push(pagedTable("rest", "rest-pager", { ...base, state, needs_decision: "false" }, (record) =>
    el("tr", { "data-key": record.key },
      el("td", { class: "key" }, keyLink(record)),
      el("td", { "data-label": "State" }, stateBadge(record)),
      el("td", { "data-label": "Request" }, el("code", { text: `${record.method} ${record.path}` })),
      el("td", { "data-label": "Claimed", text: when(record.created_at) }),
      el("td", { "data-label": "Status", text: record.response_status ? String(record.response_status) : "" })),
    "No records.", run));
  await Promise.all(scans);
}

async function exportCsv() {
  const base = filters();
  if (!base.scope) return say("Choose a scope.", true);
  // One export holds at most EXPORT_MAX_ROWS rows; `x-next-after` names
  // where the rest starts: follow it, keeping the header row once.
  const parts = [];
  let after;
  do {
    const response = await api("GET", "/v1/admin/keys.csv", { ...base, needs_decision: "true", after }, true);
    let text = await response.text();
    if (parts.length) text = text.slice(text.indexOf("\n") + 1);
    parts.push(text);
    after = response.headers.get("x-next-after");
  } while (after);
  const csv = parts.join("");
  const link = el("a", { download: `needs-decision.csv` });
  link.href = URL.createObjectURL(new Blob([csv], { type: "text/csv" }));
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  say(`Exported ${Math.max(0, csv.trim().split("\n").length - 1)} records that need a decision.`);
}

// ---- one key

let current = null;

function pair(list, name, value) {
  list.append(el("dt", { text: name }), el("dd", {}, value instanceof Node ? value : el("span", { text: value })));
}

async function showKey(scope, key) {
  listRun += 1;
  show("key");
  say("");
  current = null;
  for (const id of ["k-life", "k-request", "k-response", "k-badge"]) clear($(id));
  clear($("k-headers").tBodies[0]);
  $("k-key").textContent = "";
  $("k-scope").textContent = "";
  $("k-body").textContent = "";
  $("actions").hidden = true;
  const trailShown = showTrail(scope, key);
  const detail = await api("GET", `/v1/admin/keys/${seg(scope)}/${seg(key)}`);
  $("k-key").textContent = detail.record.key;
  $("k-scope").textContent = detail.record.scope;
  current = detail.record;
  const record = detail.record;
  $("k-badge").append(stateBadge(record),
    " ", el("span", { class: "hint", text: record.will_complete
      ? "Will complete: the completer (or the client's retry) resumes its run from its recorded steps. No decision needed; you may still release or forget it."
      : record.needs_decision
      ? "Outcome unknown: its handler may or may not have had effects. Check, then decide."
      : record.reconciled ? `Reconciled by ${record.reconciled.by}: ${record.reconciled.reason}` : "" }));
  for (const step of detail.life) {
    $("k-life").append(el("li", {}, el("strong", { text: step.event.replace("_", " ") }), ` ${when(step.at)}`));
  }
  const request = $("k-request");
  pair(request, "Method", record.method);
  pair(request, "Path", el("code", { text: record.path }));
  pair(request, "Fingerprint", el("code", { text: record.fingerprint }));
  pair(request, "Transactional", record.transactional ? "yes" : "no");
  const steps = record.steps || [];
  pair(request, "Steps recorded", steps.length
    ? el("ol", { class: "steps" }, ...steps.map((name) => el("li", {}, el("code", { text: name }))))
    : "none");
  if (record.completer) {
    pair(request, "Completer", record.completer.gave_up
      ? `gave up after ${attempts(record.completer.attempts)}`
      : `${attempts(record.completer.attempts)} so far`);
  }
  const response = $("k-response");
  const stored = detail.response;
  if (!stored) {
    pair(response, "Status", "none stored (not completed)");
    $("k-headers").hidden = true;
    $("k-body").textContent = "(none)";
  } else {
    pair(response, "Status", String(stored.status));
    pair(response, "Sealed", stored.sealed ? "yes: encrypted at rest, only the status is shown" : "no");
    if (stored.body.bytes !== undefined) pair(response, "Body size", `${stored.body.bytes} bytes`);
    $("k-headers").hidden = stored.headers.length === 0;
    for (const header of stored.headers) {
      $("k-headers").tBodies[0].append(el("tr", {}, el("td", {}, el("code", { text: header.name })), el("td", {}, el("code", { text: header.value }))));
    }
    $("k-body").textContent = stored.body.preview !== undefined
      ? stored.body.preview + (stored.body.truncated ? "\n… (cut)" : "")
      : `(${stored.body.note || "not shown"})`;
  }
  $("actions").hidden = false;
  $("act-release").disabled = record.state !== "abandoned";
  $("act-reconcile").disabled = !record.needs_decision;
  $("act-give-up").disabled = !record.will_complete;
  $("act-forget").disabled = record.state === "in_flight";
  await trailShown;
}

// ---- one key's decisions (its audit trail, kept after the record is gone)

async function showTrail(scope, key) {
  const body = $("k-trail").tBodies[0];
  clear(body);
  const empty = (text) => body.append(el("tr", { class: "empty" }, el("td", { colspan: "5", text })));
  let trail;
  try {
    trail = await api("GET", `/v1/admin/keys/${seg(scope)}/${seg(key)}/decisions`);
  } catch (error) {
    empty(`Decisions not shown: ${error.message}`);
    return;
  }
  clear(body);
  // The newest first.
  for (const decision of [...trail.decisions].reverse()) {
    body.append(el("tr", { "data-action": decision.action },
      el("td", { text: when(decision.at) }),
      el("td", { text: decision.who }),
      el("td", { text: decision.action }),
      el("td", { class: "reason", text: decision.reason }),
      el("td", { text: decision.result })));
  }
  if (!trail.decisions.length) empty("No decision taken on this key.");
  else if (trail.truncated) empty("Only the first 1000 decisions are shown: the API lists them oldest first.");
}

async function act(action) {
  if (!current) return;
  const reason = $("reason").value.trim();
  if (!reason) {
    say("Give a reason: it is written to the audit log.", true);
    $("reason").focus();
    return;
  }
  const path = `/v1/admin/keys/${seg(current.scope)}/${seg(current.key)}`;
  const { scope, key } = current;
  let done;
  if (action === "release") {
    await api("POST", `${path}/release`, { reason });
    done = `Released ${key}: the client's retry runs.`;
  } else if (action === "give-up") {
    await api("POST", `${path}/give-up`, { reason });
    done = `Gave up completing ${key}: it is abandoned, for a decision.`;
  } else if (action === "reconcile") {
    await api("POST", `${path}/reconcile`, { reason });
    done = `Marked ${key} reconciled: kept, no longer needing a decision.`;
  } else {
    await api("DELETE", path, { reason, force: current.state === "abandoned" ? "true" : "" });
    done = `Forgot ${key}.`;
  }
  $("reason").value = "";
  if (action === "reconcile" || action === "give-up") await showKey(scope, key);
  else {
    current = null;
    $("actions").hidden = true;
    $("k-badge").append(" ", el("strong", { text: action === "release" ? "(released)" : "(forgotten)" }));
    await showTrail(scope, key);
  }
  say(done);
}

// ---- routing

function fail(error) {
  if (error && error.status === 401) {
    signedOut("Your session ended (signed out, idle too long, or the service restarted): sign in again.");
    return;
  }
  say(error && error.message ? error.message : String(error), true);
}

async function route() {
  if (!identity) {
    try {
      identity = await api("GET", "/v1/admin/whoami");
    } catch (error) {
      if (error.status !== 401) throw error;
      signedOut("");
      return;
    }
    showIdentity();
  }
  const match = location.hash.match(/^#\/key\/([^/]+)\/([^/]+)$/);
  if (match) await showKey(decodeURIComponent(match[1]), decodeURIComponent(match[2]));
  else await showList();
}

document.addEventListener("DOMContentLoaded", () => {
  sessionStorage.removeItem(OLD_TOKEN);
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const field = $("token");
    const token = field.value;
    field.value = "";
    signIn(token)
      .then(() => { say(""); return route(); })
      .catch((error) => {
        if (error.status === 401) say("The admin API refused this token.", true);
        else fail(error);
      });
  });
  $("sign-out").addEventListener("click", () => signOut());
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    if (location.hash) location.hash = "";
    else showList().catch(fail);
  });
  $("export").addEventListener("click", () => exportCsv().catch(fail));
  $("back").addEventListener("click", (event) => {
    event.preventDefault();
    location.hash = "";
  });
  for (const action of ["release", "give-up", "reconcile", "forget"]) {
    $(`act-${action}`).addEventListener("click", () => act(action).catch(fail));
  }
  window.addEventListener("hashchange", () => route().catch(fail));
  route().catch(fail);
});
