// Shoal dashboard: hash-routed pages over the broker's JSON API, refreshed every 2 s.
"use strict";

const REFRESH_MS = 2000;
const page = document.getElementById("page");
const statusEl = document.getElementById("status");
let timer = null;
let generation = 0;
// Previous samples for rates: key -> {value, atMs}.
const samples = new Map();

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function fmtTime(ms) {
  if (!ms || ms <= 0) return "-";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", "");
}
function fmtBytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}
function fmtMs(ms) {
  if (ms === null || ms === undefined) return "-";
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(2)} s`;
}
// Rate per second of a growing counter since the previous poll.
function rate(key, value, atMs) {
  const prev = samples.get(key);
  samples.set(key, { value, atMs });
  if (!prev || atMs <= prev.atMs || value < prev.value) return null;
  return ((value - prev.value) * 1000) / (atMs - prev.atMs);
}
function fmtRate(r) {
  return r === null ? "…" : `${r.toFixed(r < 10 ? 1 : 0)}/s`;
}
// The port's sign-in state ({required, signedIn, account, csrf}) from /api/session.
let session = null;
class SignInNeeded extends Error {}
async function loadSession() {
  const r = await fetch("/api/session", { credentials: "same-origin" });
  session = await r.json();
  const who = document.getElementById("who");
  who.innerHTML = session.signedIn
    ? `<span data-testid="account">${esc(session.account)}</span> <button class="secondary" data-signout="1" data-testid="sign-out">Sign out</button>`
    : "";
}
// Every POST carries the page's token (cross-site request protection).
async function api(path, opts = {}) {
  const o = { credentials: "same-origin", ...opts, headers: { ...(opts.headers || {}) } };
  if ((o.method || "GET") !== "GET") o.headers["X-Shoal-Csrf"] = session ? session.csrf : "";
  const r = await fetch(path, o);
  const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (r.status === 401 && body.signIn) throw new SignInNeeded(body.error);
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}
let signInNote = "";
function signInPage() {
  const acl = session && session.acl;
  const token = session && session.token;
  let html = `<h1>Sign in</h1><p class="muted">This port is behind ${acl ? "the broker's ACL" : "a token"}.</p>`;
  if (signInNote) html += `<div class="warn" data-testid="sign-in-error">${esc(signInNote)}</div>`;
  if (acl) {
    html += `<form class="inline" id="signin" data-testid="sign-in-acl">
      <input type="text" name="accessKey" placeholder="access key" autocomplete="username">
      <input type="password" name="secretKey" placeholder="secret key" autocomplete="current-password">
      <button type="submit">Sign in</button></form>`;
  }
  if (token) {
    html += `<form class="inline" id="signin-token" data-testid="sign-in-token">
      <input type="password" name="token" placeholder="token">
      <button type="submit">Sign in with the token</button></form>`;
  }
  return html;
}
async function signIn(payload) {
  try {
    const d = await api("/api/session", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(payload) });
    signInNote = "";
    session = { ...session, signedIn: true, account: d.account, csrf: d.csrf };
  } catch (e) {
    signInNote = e.message;
  }
  await loadSession();
  schedule();
}
function card(k, v, testid) {
  return `<div class="card"><div class="k">${esc(k)}</div><div class="v" data-testid="${esc(testid || "")}">${esc(v)}</div></div>`;
}
function table(headers, rows, testid) {
  const th = headers.map((h) => `<th class="${h.num ? "num" : ""}">${esc(h.label || h)}</th>`).join("");
  return `<table data-testid="${esc(testid || "")}"><thead><tr>${th}</tr></thead><tbody>${rows.join("") || `<tr><td colspan="${headers.length}" class="muted">none</td></tr>`}</tbody></table>`;
}
const num = (label) => ({ label, num: true });

// ---- pages ----

async function overview() {
  const d = await api("/api/cluster");
  const b = d.broker;
  let html = `<h1>Cluster</h1>`;
  if (b) {
    const at = Date.now();
    html += `<div class="cards">
      ${card("This broker", b.name)}
      ${card("Uptime", fmtMs(b.uptimeMs))}
      ${card("Messages in", `${b.messagesPut} (${fmtRate(rate("put", b.messagesPut, at))})`, "messages-put")}
      ${card("Messages out", `${b.messagesPulled} (${fmtRate(rate("got", b.messagesPulled, at))})`, "messages-pulled")}
      ${card("Connections", b.connections)}
      ${card("Held pulls", b.pullsHeldNow)}
      ${card("Commit log", fmtBytes(b.commitLogBytes))}
      ${card("Unflushed", fmtBytes(b.unflushedBytes))}
      ${card("Topics", b.topics)}
      ${card("Groups online", b.groupsOnline)}
    </div>`;
  }
  const rows = [];
  for (const c of d.clusters) {
    for (const br of c.brokers) {
      rows.push(`<tr><td>${esc(c.name)}</td><td>${esc(br.name)}</td><td class="num">${esc(br.id)}</td><td>${esc(br.addr)}</td></tr>`);
    }
  }
  html += `<h2>Brokers</h2>` + table(["Cluster", "Broker", num("Id"), "Address"], rows, "brokers");
  const r = d.replication;
  if (r) {
    const role = r.role === "master" ? `master of epoch ${r.epoch}` : r.role === "replica" ? `replica (epoch ${r.epoch}, following ${r.master ?? "nobody yet"})` : "joining";
    html += `<h2>Replication</h2><div class="cards">
      ${card("Group", r.group)}
      ${card("Broker id", r.brokerId ?? "none yet")}
      ${card("Role", role, "replication-role")}
      ${card("Log end", r.logEnd)}
      ${card("Confirmed", r.confirmed)}
      ${card("Writes", r.writable ?? "accepted")}
    </div>`;
    if (r.role === "master") {
      const reps = r.replicas.map(([id, acked]) => {
        const lag = acked === null ? "not following yet" : fmtBytes(r.logEnd - acked);
        const inSync = r.inSync.includes(id) ? "yes" : "no";
        return `<tr><td class="num">${esc(id)}</td><td>${inSync}</td><td class="num">${acked ?? "-"}</td><td class="num">${esc(lag)}</td></tr>`;
      });
      html += table([num("Replica"), "In sync", num("Acknowledged"), num("Lag")], reps, "replicas");
      html += `<p class="muted">In-sync set ${esc(r.inSync.join(", "))} (epoch ${r.inSyncEpoch}); ${r.pendingAcks} sends waiting for it.</p>`;
    }
  }
  html += `<p class="muted">Name servers: ${esc(d.namesrv.join("; "))}. Prometheus metrics at <a href="/metrics">/metrics</a>.</p>`;
  return html;
}

let showSystem = false;
async function topics() {
  const d = await api(`/api/topics?system=${showSystem}`);
  const rows = d.topics.map((t) => {
    const rin = rate(`in:${t.topic}`, t.messagesIn, d.atMs);
    const rout = rate(`out:${t.topic}`, t.messagesOut, d.atMs);
    return `<tr data-topic="${esc(t.topic)}"><td><a href="#/topics/${encodeURIComponent(t.topic)}">${esc(t.topic)}</a></td>
      <td>${esc(t.brokers.join(", "))}</td><td data-testid="topic-type">${esc(t.messageType)}</td><td class="num">${t.readQueues}/${t.writeQueues}</td>
      <td class="num" data-testid="topic-stored">${t.messages}</td><td class="num">${fmtRate(rin)}</td><td class="num">${fmtRate(rout)}</td></tr>`;
  });
  return `<h1>Topics</h1>
    <p><a href="#/new-topic" data-testid="new-topic">Create a topic</a></p>
    <form class="inline"><label><input type="checkbox" id="sys" ${showSystem ? "checked" : ""}> show system topics (retry, dead-letter, internal)</label></form>` +
    table(["Topic", "Brokers", "Message type", num("Queues r/w"), num("Messages stored"), num("In (this broker)"), num("Out (this broker)")], rows, "topics");
}

let topicNote = "";
// Creates a topic on every broker (as `shoal topic create` does), with RocketMQ 5's message type.
async function newTopicPage() {
  let html = `<h1>Create a topic</h1>
    <form class="inline" id="topicform"><input type="text" name="topic" placeholder="topic name" required>
    <input type="number" name="queues" value="8" min="1" max="1024">
    <select name="messageType"><option value="">any message type</option><option>NORMAL</option><option>FIFO</option><option>DELAY</option><option>TRANSACTION</option><option>MIXED</option></select>
    <button type="submit">Create</button></form>`;
  if (topicNote) html += `<div class="warn" data-testid="topic-note">${esc(topicNote)}</div>`;
  return html;
}

async function topicPage(name) {
  const d = await api(`/api/topics/${encodeURIComponent(name)}`);
  const rows = d.queues.map((q) => `<tr><td>${esc(q.broker)}</td><td class="num">${q.queue}</td><td class="num">${q.minOffset}</td><td class="num">${q.maxOffset}</td><td>${fmtTime(q.lastStoreMs)}</td></tr>`);
  return `<h1>Topic ${esc(name)}</h1>` + table(["Broker", num("Queue"), num("Min offset"), num("Max offset"), "Last stored"], rows, "topic-queues");
}

async function groups() {
  const d = await api("/api/groups");
  const rows = d.groups.map((g) => {
    const warn = [];
    if (g.duplicateClientIds.length) warn.push(`duplicate client ids: ${g.duplicateClientIds.join(", ")}`);
    if (g.inconsistentTopics.length) warn.push(`inconsistent subscriptions: ${g.inconsistentTopics.join(", ")}`);
    return `<tr data-group="${esc(g.group)}"><td><a href="#/groups/${encodeURIComponent(g.group)}">${esc(g.group)}</a></td>
      <td><span class="pill ${esc(g.state)}">${esc(g.state)}</span></td><td>${esc(g.mode)}</td>
      <td class="num">${g.members}</td><td class="num lag ${g.lag > 0 ? "pos" : ""}">${g.lag}</td><td>${esc(warn.join("; "))}</td></tr>`;
  });
  return `<h1>Consumer groups</h1>` + table(["Group", "State", "Mode", num("Members"), num("Lag"), "Problems"], rows, "groups");
}

function moveText(m) {
  const at = m.atMs ? ` at ${fmtTime(m.atMs)}` : "";
  return `${m.topic}#${m.queue}: ${m.from ?? "(none)"} → ${m.to ?? "(none)"}${at}`;
}

function timelineHtml(d) {
  if (!d.rebalances.length) return `<p class="muted" data-testid="timeline-empty">No rebalance observed yet.</p>`;
  const max = Math.max(1, ...d.rebalances.map((r) => r.convergenceMs || 0));
  const items = d.rebalances.map((r) => {
    const who = [];
    if (r.joined && r.joined.length) who.push(`joined: ${r.joined.join(", ")}`);
    if (r.left && r.left.length) who.push(`left: ${r.left.join(", ")}`);
    const bar = r.convergenceMs !== null && r.convergenceMs !== undefined
      ? `<span class="bar" style="width:${Math.max(2, Math.round((200 * r.convergenceMs) / max))}px"></span>` : "";
    const moves = r.moves.map((m) => `<li>${esc(moveText(m))}</li>`).join("");
    return `<li class="${esc(r.outcome)}" data-testid="rebalance">
      <div class="head"><span class="muted">${fmtTime(r.atMs)}</span><span class="cause" data-testid="rebalance-cause">${esc(r.cause)}</span>
      <span class="muted">${esc(who.join("; "))}</span><span class="pill ${esc(r.outcome)}">${esc(r.outcome)}</span>
      <span>converged in <b data-testid="rebalance-convergence">${fmtMs(r.convergenceMs)}</b> ${bar}</span>
      <span class="muted">${r.moves.length} queue${r.moves.length === 1 ? "" : "s"} moved, ${r.members} member${r.members === 1 ? "" : "s"} after</span></div>
      ${moves ? `<ul class="moves" data-testid="rebalance-moves">${moves}</ul>` : ""}</li>`;
  });
  return `<ul class="timeline" data-testid="timeline">${items.join("")}</ul>`;
}

// A POP group on this broker: leases in flight, redeliveries, dead letters, who holds what.
function popHtml(p) {
  let html = `<h2>POP consumption <span class="muted">(this broker)</span></h2><div class="cards">
    ${card("In flight under lease", p.inflight, "pop-inflight")}
    ${card("Acked", p.acked, "pop-acked")}
    ${card("Redelivered", p.redeliveries, "pop-redeliveries")}
    ${card("Dead-lettered", p.deadLettered, "pop-dead")}
    ${card("In the DLQ now", p.dlqMessages, "pop-dlq")}
  </div>`;
  const consumers = p.consumers.map((c) => `<tr><td>${esc(c.consumer)}</td><td class="num">${c.inflight}</td></tr>`);
  html += table(["Consumer", num("In flight")], consumers, "pop-consumers");
  const queues = p.queues.map((q) => `<tr><td>${esc(q.topic)}</td><td class="num">${q.queueId}</td><td class="num">${q.ackedOffset}</td>
    <td class="num">${q.cursor}</td><td class="num">${q.maxOffset}</td><td class="num">${q.inflight}</td></tr>`);
  html += table(["Topic", num("Queue"), num("Acked offset"), num("Cursor"), num("Max offset"), num("In flight")], queues, "pop-queues");
  return html;
}

async function groupPage(name) {
  const d = await api(`/api/groups/${encodeURIComponent(name)}`);
  const committed = d.queues.reduce((s, q) => s + q.committedOffset, 0);
  const consumeRate = rate(`commit:${name}`, committed, d.atMs);
  let html = `<h1>Consumer group ${esc(name)}</h1><div class="cards">
    ${card("State", d.state, "group-state")}
    ${card("Mode", `${d.mode} / ${d.messageModel}`, "group-mode")}
    ${card("Members", d.members.length, "group-members")}
    ${card("Total lag", d.totalLag, "group-lag")}
    ${card("Consume rate", fmtRate(consumeRate), "group-rate")}
  </div>`;
  if (d.duplicateClientIds.length) html += `<div class="warn" data-testid="dup-ids">Client ids used by more than one connection: ${esc(d.duplicateClientIds.join(", "))}. Queue allocation breaks: give each consumer its own instance name.</div>`;
  if (d.inconsistentTopics.length) html += `<div class="warn" data-testid="inconsistent">Members subscribe differently to: ${esc(d.inconsistentTopics.join(", "))}. Some queues of these topics have no consumer.</div>`;
  if (d.unreachableMembers.length) html += `<div class="warn">Members that did not report their queues: ${esc(d.unreachableMembers.join(", "))}</div>`;
  const members = d.members.map((m) => `<tr><td>${esc(m.clientId)}${m.duplicate ? ' <span class="pill notConverged">duplicate</span>' : ""}</td><td>${esc(m.addr)}</td><td>${esc(m.language)}</td><td class="num">${m.version}</td><td class="num">${m.queues}</td></tr>`);
  html += `<h2>Members</h2>` + table(["Client id", "Address", "Language", num("Version"), num("Queues owned")], members, "members");
  const subs = Object.entries(d.subscriptions).map(([t, s]) => `<tr><td>${esc(t)}</td><td>${esc(s)}</td></tr>`);
  html += `<h2>Subscriptions</h2>` + table(["Topic", "Expression"], subs, "subscriptions");
  const queues = d.queues.map((q) => `<tr data-queue="${esc(q.topic)}#${q.queue}"><td>${esc(q.topic)}</td><td>${esc(q.broker)}</td><td class="num">${q.queue}</td>
    <td class="num">${q.brokerOffset}</td><td class="num">${q.committedOffset}</td><td class="num lag ${q.lag > 0 ? "pos" : ""}" data-testid="queue-lag">${q.lag}</td>
    <td data-testid="queue-owner">${esc(q.owner ?? "-")}</td><td>${fmtTime(q.lastConsumedStoreMs)}</td></tr>`);
  html += `<h2>Queues</h2>` + table(["Topic", "Broker", num("Queue"), num("Broker offset"), num("Committed offset"), num("Lag"), "Owner", "Last consumed (store time)"], queues, "queues");
  if (d.pop) html += popHtml(d.pop);
  html += `<h2>Rebalance timeline <span class="muted">(${d.rebalanceSource === "coordinator" ? "from the group coordinator" : "observed by this broker: membership changes and the first pull of each queue's new owner"})</span></h2>` + timelineHtml(d);
  return html;
}

let lastQuery = null;
async function messagesPage() {
  let html = `<h1>Messages</h1>
    <form class="inline" id="msgform">
      <input type="text" name="id" placeholder="message id or offset message id" value="${esc(lastQuery?.id || "")}">
      <input type="text" name="key" placeholder="key" value="${esc(lastQuery?.key || "")}">
      <input type="text" name="topic" placeholder="topic (for a key or a message id)" value="${esc(lastQuery?.topic || "")}">
      <button type="submit">Look up</button></form>`;
  if (lastQuery) {
    try {
      const qs = new URLSearchParams(lastQuery).toString();
      const d = await api(`/api/messages?${qs}`);
      const rows = d.messages.map((m) => `<tr><td>${esc(m.msgId)}</td><td>${esc(m.topic)}</td><td class="num">${m.queueId}</td><td class="num">${m.queueOffset}</td><td>${esc(m.tags ?? "-")}</td><td>${esc(m.keys ?? "-")}</td><td>${fmtTime(m.storeMs)}</td><td>${esc(m.body.slice(0, 80))}</td></tr>`);
      html += table(["Message id", "Topic", num("Queue"), num("Offset"), "Tags", "Keys", "Stored", "Body"], rows, "messages");
    } catch (e) {
      html += `<div class="warn" data-testid="message-error">${esc(e.message)}</div>`;
    }
  }
  return html;
}

let dlqGroup = "";
let dlqNote = "";
async function dlqPage() {
  let html = `<h1>Dead-letter queues</h1>
    <form class="inline" id="dlqform"><input type="text" name="group" placeholder="consumer group" value="${esc(dlqGroup)}"><button type="submit">Show</button></form>`;
  if (dlqNote) html += `<div class="warn" data-testid="dlq-note">${esc(dlqNote)}</div>`;
  if (dlqGroup) {
    try {
      const d = await api(`/api/dlq/${encodeURIComponent(dlqGroup)}`);
      const rows = d.messages.map((m) => `<tr><td>${esc(m.msgId)}</td><td>${esc(m.properties.RETRY_TOPIC || m.properties.DLQ_ORIGIN_TOPIC || "-")}</td><td class="num">${m.reconsumeTimes}</td><td>${fmtTime(m.storeMs)}</td><td>${esc(m.body.slice(0, 60))}</td>
        <td><button class="secondary" data-resend="${esc(m.msgId)}">Resend</button></td></tr>`);
      html += table(["Message id", "Original topic", num("Attempts"), "Stored", "Body", ""], rows, "dlq");
      if (d.messages.length) html += `<p><button data-resend="">Resend all ${d.messages.length}</button></p>`;
    } catch (e) {
      html += `<div class="warn">${esc(e.message)}</div>`;
    }
  }
  return html;
}

// ---- routing and refresh ----

function route() {
  const h = decodeURIComponent(location.hash.replace(/^#/, "")) || "/";
  const parts = h.split("/").filter(Boolean);
  if (parts[0] === "new-topic") return { nav: "topics", render: newTopicPage, live: false };
  if (parts[0] === "topics" && parts[1]) return { nav: "topics", render: () => topicPage(parts.slice(1).join("/")), live: true };
  if (parts[0] === "topics") return { nav: "topics", render: topics, live: true };
  if (parts[0] === "groups" && parts[1]) return { nav: "groups", render: () => groupPage(parts.slice(1).join("/")), live: true };
  if (parts[0] === "groups") return { nav: "groups", render: groups, live: true };
  if (parts[0] === "messages") return { nav: "messages", render: messagesPage, live: false };
  if (parts[0] === "dlq") return { nav: "dlq", render: dlqPage, live: false };
  return { nav: "overview", render: overview, live: true };
}

async function refresh() {
  const g = generation;
  const r = route();
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === r.nav));
  if (session && session.required && !session.signedIn) {
    clearInterval(timer);
    page.innerHTML = signInPage();
    statusEl.textContent = "signed out";
    page.dataset.loaded = "sign-in";
    return;
  }
  try {
    const html = await r.render();
    if (g !== generation) return;
    // Keep focus and typed text of forms: only live pages are re-rendered by the timer.
    page.innerHTML = html;
    statusEl.textContent = `updated ${new Date().toLocaleTimeString()}`;
    page.dataset.loaded = r.nav;
  } catch (e) {
    if (g !== generation) return;
    if (e instanceof SignInNeeded) {
      // The session ended (expired, or signed out elsewhere): back to the sign-in form.
      signInNote = e.message;
      await loadSession();
      schedule();
      return;
    }
    page.innerHTML = `<div class="warn" data-testid="error">${esc(e.message)}</div>`;
    statusEl.textContent = "error";
  }
}

function schedule() {
  clearInterval(timer);
  generation++;
  refresh();
  if (route().live) timer = setInterval(refresh, REFRESH_MS);
}

page.addEventListener("change", (e) => {
  if (e.target.id === "sys") { showSystem = e.target.checked; refresh(); }
});
page.addEventListener("submit", (e) => {
  e.preventDefault();
  const f = new FormData(e.target);
  // getAttribute: a form's `id` property is shadowed by its input named "id".
  const form = e.target.getAttribute("id");
  if (form === "msgform") {
    lastQuery = {};
    for (const k of ["id", "key", "topic"]) if (f.get(k)) lastQuery[k] = f.get(k);
  } else if (form === "dlqform") {
    dlqGroup = String(f.get("group") || "");
    dlqNote = "";
  } else if (form === "topicform") {
    const body = { topic: String(f.get("topic") || ""), queues: Number(f.get("queues") || 8), messageType: String(f.get("messageType") || "") || null };
    api("/api/topics", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })
      .then((d) => { topicNote = `created ${d.topic} (${d.messageType || "any message type"}) on ${d.brokers.join(", ")}`; })
      .catch((err) => { topicNote = err.message; })
      .then(refresh);
    return;
  } else if (form === "signin") {
    signIn({ accessKey: String(f.get("accessKey") || ""), secretKey: String(f.get("secretKey") || "") });
    return;
  } else if (form === "signin-token") {
    signIn({ token: String(f.get("token") || "") });
    return;
  }
  refresh();
});
document.getElementById("who").addEventListener("click", async (e) => {
  if (!e.target.dataset || !e.target.dataset.signout) return;
  await api("/api/session/end", { method: "POST" }).catch(() => {});
  await loadSession();
  schedule();
});
page.addEventListener("click", async (e) => {
  const id = e.target.dataset ? e.target.dataset.resend : undefined;
  if (id === undefined) return;
  try {
    const q = id ? `?id=${encodeURIComponent(id)}` : "";
    const d = await api(`/api/dlq/${encodeURIComponent(dlqGroup)}/resend${q}`, { method: "POST" });
    dlqNote = `resent ${d.resent.length}: ` + d.resent.map((r) => `${r.msgId} → ${r.topic}`).join(", ");
  } catch (err) {
    dlqNote = err.message;
  }
  refresh();
});
window.addEventListener("hashchange", schedule);
loadSession().catch(() => {}).then(schedule);
