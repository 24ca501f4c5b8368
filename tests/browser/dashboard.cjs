// Drives Debian's chromium (playwright-core) through the Shoal dashboard of a running
// `shoal dev`, checks that the pages show what the test set up, and takes one screenshot per
// page. Run by crates/shoal/tests/dashboard_browser.rs, which passes (environment):
//   DASHBOARD_URL   http://127.0.0.1:PORT
//   EXPECT          JSON: {group, topic, owners: {"Topic#q": clientId}, lag: {"Topic#q": n},
//                   left: clientId (a member that left: a member_left rebalance must show),
//                   dlqGroup, dlqTopic, key, keyCount}
//   SHOAL_BIN, SHOAL_NAMESRV  to send messages while a page is open (live updates)
//   SCREENSHOTS     directory for the PNGs
// Exit code 0 when every check passed; the failed check is printed otherwise.
"use strict";

const { chromium } = require("playwright-core");
const { execFileSync } = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");

const url = process.env.DASHBOARD_URL;
const expect = JSON.parse(process.env.EXPECT);
const shots = process.env.SCREENSHOTS;
fs.mkdirSync(shots, { recursive: true });

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok: ${what}`);
}

// Polls `fn` until it returns a truthy value (the page updates itself every 2 s).
async function eventually(what, fn, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await fn();
      if (last) {
        console.log(`ok: ${what}`);
        return last;
      }
    } catch (e) {
      last = e.message;
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`check failed within ${timeoutMs} ms: ${what} (last: ${JSON.stringify(last)})`);
}

async function main() {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "shoal-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
    viewport: { width: 1360, height: 900 },
  });
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(2000);
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  try {
    // Cluster page: the broker and live counters.
    await page.goto(`${url}/#/`);
    await eventually("cluster page lists broker-a", async () =>
      (await page.locator('[data-testid="brokers"]').innerText()).includes("broker-a"));
    await page.screenshot({ path: path.join(shots, "cluster.png"), fullPage: true });

    // Topics page: live update without a reload when messages arrive.
    await page.goto(`${url}/#/topics`);
    const row = page.locator(`tr[data-topic="${expect.topic}"] [data-testid="topic-stored"]`);
    const before = Number(await eventually("topics page shows the topic", async () => {
      const t = await row.innerText();
      return t === "" ? null : t;
    }));
    execFileSync(process.env.SHOAL_BIN, ["send", expect.topic, "--body", "live-{i}", "--count", "5"], {
      env: { ...process.env },
      stdio: "ignore",
    });
    await eventually(`stored messages of ${expect.topic} go from ${before} to ${before + 5} without a reload`, async () =>
      Number(await row.innerText()) === before + 5);
    check(!(await page.locator("body").innerText()).includes("%RETRY%"), "system topics are hidden by default");
    await page.check("#sys");
    await eventually("system topics shown on request", async () =>
      (await page.locator('[data-testid="topics"]').innerText()).includes("%RETRY%"));
    await page.screenshot({ path: path.join(shots, "topics.png"), fullPage: true });

    // Groups page.
    await page.goto(`${url}/#/groups`);
    await eventually(`groups page lists ${expect.group} (${expect.mode}) with 1 member`, async () => {
      const t = await page.locator(`tr[data-group="${expect.group}"]`).innerText();
      return t.includes(expect.mode) && /\t1\t/.test(t);
    });
    await eventually(`groups page lists ${expect.classicGroup} in classic mode`, async () =>
      (await page.locator(`tr[data-group="${expect.classicGroup}"]`).innerText()).includes("classic"));
    await eventually(`groups page shows lag ${expect.slowLag} for ${expect.slowGroup}, which has no member`, async () => {
      const t = await page.locator(`tr[data-group="${expect.slowGroup}"]`).innerText();
      return t.includes("EMPTY") && t.split("\t")[4] === String(expect.slowLag);
    });
    await page.screenshot({ path: path.join(shots, "groups.png"), fullPage: true });
    await page.goto(`${url}/#/groups/${encodeURIComponent(expect.slowGroup)}`);
    await eventually(`the queues of ${expect.slowGroup} add up to lag ${expect.slowLag} and have no owner`, async () => {
      const lags = await page.locator('[data-testid="queues"] tr[data-queue^="Slow#"] [data-testid="queue-lag"]').allInnerTexts();
      const owners = await page.locator('[data-testid="queues"] tr[data-queue^="Slow#"] [data-testid="queue-owner"]').allInnerTexts();
      return lags.length >= 1 && lags.reduce((a, b) => a + Number(b), 0) === expect.slowLag &&
        Number(await page.locator('[data-testid="group-lag"]').innerText()) === expect.slowLag &&
        owners.every((o) => o === "-");
    });

    // Group page: owners and lag per queue, the rebalance timeline.
    await page.goto(`${url}/#/groups/${encodeURIComponent(expect.group)}`);
    for (const [q, owner] of Object.entries(expect.owners)) {
      await eventually(`queue ${q} is owned by ${owner} with lag ${expect.lag[q]}`, async () => {
        const r = page.locator(`tr[data-queue="${q}"]`);
        return (
          (await r.locator('[data-testid="queue-owner"]').innerText()) === owner &&
          Number(await r.locator('[data-testid="queue-lag"]').innerText()) === expect.lag[q]
        );
      });
    }
    // Coordinated group: the coordinator's history (a member left, its queues moved back).
    await eventually(`${expect.group}: the timeline shows a member leaving, queues moving, and a convergence time`, async () => {
      const items = page.locator('[data-testid="rebalance"]');
      const n = await items.count();
      for (let i = 0; i < n; i++) {
        const t = await items.nth(i).innerText();
        if (/leave|member_left/.test(t) && t.includes("→") && /converged in \d/.test(t)) return true;
      }
      return false;
    });
    check((await page.locator('[data-testid="group-mode"]').innerText()).startsWith(expect.mode), `${expect.group} is shown in ${expect.mode} mode`);
    await page.screenshot({ path: path.join(shots, "group.png"), fullPage: true });

    // Classic group: the broker's observations (joins, the leave, queues moved from the leaver).
    await page.goto(`${url}/#/groups/${encodeURIComponent(expect.classicGroup)}`);
    await eventually(`${expect.classicGroup}: the timeline shows ${expect.classicLeft} leaving and its queues moving to the other member`, async () => {
      const items = page.locator('[data-testid="rebalance"]');
      const n = await items.count();
      for (let i = 0; i < n; i++) {
        const t = await items.nth(i).innerText();
        if (t.includes("member_left") && t.includes(`left: ${expect.classicLeft}`) && t.includes(`${expect.classicLeft} →`) && /converged in \d/.test(t)) return true;
      }
      return false;
    });
    const causes = await page.locator('[data-testid="rebalance-cause"]').allInnerTexts();
    check(causes.filter((c) => c === "member_joined").length >= 2, `the classic timeline also shows both joins (${causes.join(", ")})`);
    await page.screenshot({ path: path.join(shots, "group-classic.png"), fullPage: true });

    // Message lookup by key.
    await page.goto(`${url}/#/messages`);
    await page.waitForSelector('#page[data-loaded="messages"]');
    await page.fill('input[name="key"]', expect.key);
    await page.fill('input[name="topic"]', expect.dlqTopic);
    await page.click("#msgform button");
    await eventually(`lookup by key ${expect.key} finds ${expect.keyCount} message(s)`, async () =>
      (await page.locator('[data-testid="messages"] tbody tr').count()) === expect.keyCount);
    await page.screenshot({ path: path.join(shots, "messages.png"), fullPage: true });

    // Dead letters: list, resend one.
    await page.goto(`${url}/#/dlq`);
    await page.waitForSelector('#page[data-loaded="dlq"]');
    await page.fill('input[name="group"]', expect.dlqGroup);
    await page.click("#dlqform button");
    await eventually(`dead-letter queue of ${expect.dlqGroup} lists its messages`, async () =>
      (await page.locator('[data-testid="dlq"] tbody tr button').count()) >= 1);
    await page.screenshot({ path: path.join(shots, "dlq.png"), fullPage: true });
    await page.locator('[data-testid="dlq"] tbody tr button').first().click();
    await eventually("resend reports the original topic", async () =>
      (await page.locator('[data-testid="dlq-note"]').innerText()).includes(`→ ${expect.dlqTopic}`));

    check(errors.length === 0, `no JavaScript errors (${errors.join("; ")})`);
  } catch (e) {
    await page.screenshot({ path: path.join(shots, "failure.png"), fullPage: true }).catch(() => {});
    console.error(`JavaScript errors: ${errors.join("; ")}`);
    console.error(`page text at the failure:\n${await page.locator("body").innerText().catch(() => "?")}`);
    throw e;
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().then(
  () => console.log("dashboard browser test: passed"),
  (e) => {
    console.error(String(e && e.stack ? e.stack : e));
    process.exit(1);
  },
);
