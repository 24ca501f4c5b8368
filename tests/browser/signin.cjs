// Signs in to the dashboard of a broker with ACL on, in Debian's chromium (playwright-core),
// as an operator would: the sign-in form first, a wrong secret refused, the admin account's
// pages, a lookup refused for an account without the permission (said as a refusal), the
// token, and signing out. Run by crates/shoal/tests/dashboard_browser.rs, which passes
// (environment):
//   DASHBOARD_URL   http://127.0.0.1:PORT
//   EXPECT          JSON: {admin: [accessKey, secretKey], user: [accessKey, secretKey],
//                   token, topic, key, body}
//   SCREENSHOTS     directory for the PNGs
// Exit code 0 when every check passed; the failed check is printed otherwise.
"use strict";

const { chromium } = require("playwright-core");
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

async function eventually(what, fn, timeoutMs = 20000) {
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
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`check failed within ${timeoutMs} ms: ${what} (last: ${JSON.stringify(last)})`);
}

async function main() {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "shoal-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
    viewport: { width: 1360, height: 900 },
  });
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(2000);
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const signIn = async (ak, sk) => {
    await page.waitForSelector('[data-testid="sign-in-acl"]');
    await page.fill('#signin input[name="accessKey"]', ak);
    await page.fill('#signin input[name="secretKey"]', sk);
    await page.click("#signin button");
  };
  const signOut = async () => {
    await page.click('[data-testid="sign-out"]');
    await eventually("signed out: the sign-in form again", async () =>
      (await page.locator("#page").getAttribute("data-loaded")) === "sign-in");
  };
  const lookUp = async () => {
    await page.goto(`${url}/#/messages`);
    await page.waitForSelector('#page[data-loaded="messages"]');
    await page.fill('input[name="key"]', expect.key);
    await page.fill('input[name="topic"]', expect.topic);
    await page.click("#msgform button");
  };
  try {
    await page.goto(`${url}/#/topics`);
    await eventually("the page asks for a sign-in and shows no data", async () =>
      (await page.locator("#page").getAttribute("data-loaded")) === "sign-in" &&
      !(await page.locator("body").innerText()).includes(expect.topic));
    check(await page.locator('[data-testid="sign-in-token"]').isVisible(), "the token form is offered too");
    await page.screenshot({ path: path.join(shots, "sign-in.png"), fullPage: true });

    await signIn(expect.admin[0], "not-the-secret");
    await eventually("a wrong secret is refused, said so", async () =>
      (await page.locator('[data-testid="sign-in-error"]').innerText()).includes("sign-in refused"));

    await signIn(expect.admin[0], expect.admin[1]);
    await eventually(`signed in as ${expect.admin[0]}`, async () =>
      (await page.locator('[data-testid="account"]').innerText()) === expect.admin[0]);
    await eventually(`the topics page lists ${expect.topic}`, async () =>
      (await page.locator('[data-testid="topics"]').innerText()).includes(expect.topic));
    await lookUp();
    await eventually(`${expect.admin[0]}'s key lookup finds the message`, async () =>
      (await page.locator('[data-testid="messages"]').innerText()).includes(expect.body));
    await page.screenshot({ path: path.join(shots, "signed-in.png"), fullPage: true });
    await signOut();

    await signIn(expect.user[0], expect.user[1]);
    await eventually(`signed in as ${expect.user[0]}`, async () =>
      (await page.locator('[data-testid="account"]').innerText()) === expect.user[0]);
    await lookUp();
    await eventually("the lookup of an account without the permission shows the refusal", async () => {
      const t = await page.locator('[data-testid="message-error"]').innerText();
      return t.includes("refused by the ACL") && !t.includes("not found");
    });
    await page.screenshot({ path: path.join(shots, "refused.png"), fullPage: true });
    await signOut();

    await page.fill('#signin-token input[name="token"]', expect.token);
    await page.click("#signin-token button");
    await eventually("signed in with the token, as its account", async () =>
      (await page.locator('[data-testid="account"]').innerText()) === expect.admin[0]);
    await page.goto(`${url}/#/`);
    await eventually("the cluster page lists broker-a", async () =>
      (await page.locator('[data-testid="brokers"]').innerText()).includes("broker-a"));

    check(errors.length === 0, `no JavaScript errors (${errors.join("; ")})`);
  } catch (e) {
    await page.screenshot({ path: path.join(shots, "sign-in-failure.png"), fullPage: true }).catch(() => {});
    console.error(`page text at the failure:\n${await page.locator("body").innerText().catch(() => "?")}`);
    throw e;
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().then(
  () => console.log("dashboard sign-in browser test: passed"),
  (e) => {
    console.error(String(e && e.stack ? e.stack : e));
    process.exit(1);
  },
);
