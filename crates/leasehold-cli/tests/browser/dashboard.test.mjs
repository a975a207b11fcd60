// `leasehold dashboard` in a real browser: Debian's Chromium, headless,
// driven by playwright-core (which downloads no browser).
//
//   LEASEHOLD_BIN=target/debug/leasehold node --test dashboard.test.mjs
//
// LEASEHOLD_SCREENSHOT=PATH also saves a screenshot of the page there
// (docs/dashboard.png is made so). CHROMIUM overrides /usr/bin/chromium.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const bin = resolve(process.env.LEASEHOLD_BIN ?? "../../../../target/debug/leasehold");
const browserPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const TOKEN = "dashboard-test-token";
const dir = mkdtempSync(join(tmpdir(), "leasehold-dashboard-"));
const store = `sqlite://${dir}/locks.db`;
const children = [];
let context, page, base;

/** Where `leasehold dashboard` says it listens. */
const LISTENING = /on (http:\/\/[0-9.:]+)\//;

/**
 * Starts `leasehold --store STORE ARGS` (the test's store unless `on` names
 * another); resolves with the child once `ready` matches a stdout line.
 */
function start(args, ready, on = store) {
  const child = spawn(bin, ["--store", on, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let out = "";
  let err = "";
  child.stderr.on("data", (d) => (err += d));
  return new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`no ${ready} from leasehold ${args.join(" ")}: ${out} ${err}`)), 15000);
    child.stdout.on("data", (d) => {
      out += d;
      const m = out.match(ready);
      if (m) {
        clearTimeout(timer);
        ok({ child, match: m, stderr: () => err });
      }
    });
    child.on("exit", (code) => fail(new Error(`leasehold ${args.join(" ")} exited ${code}: ${out} ${err}`)));
  });
}

const exited = (child) =>
  child.exitCode !== null ? Promise.resolve(child.exitCode) : new Promise((ok) => child.on("exit", (code) => ok(code)));

before(async () => {
  const dash = await start(
    ["dashboard", "--listen", "127.0.0.1:0", "--admin-token", TOKEN, "--poll", "200ms"],
    LISTENING,
  );
  base = dash.match[1];
  context = await chromium.launchPersistentContext(join(dir, "profile"), {
    executablePath: browserPath,
    headless: true,
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
  page = context.pages()[0] ?? (await context.newPage());
  await page.goto(base + "/");
  await page.getByText("no locks held").waitFor({ timeout: 5000 });
});

after(async () => {
  await context?.close();
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

test("a lease taken with `leasehold run` shows within a second, counts down, and goes on release", async () => {
  const run = await start(["run", "--ttl", "30s", "dash:job", "--", "sh", "-c", "echo held; sleep 2"], /held/);
  const row = page.locator('tr[data-key="dash:job"][data-kind="mutex"]');
  const seenAt = Date.now();
  await row.waitFor({ timeout: 1000 });
  assert.ok(Date.now() - seenAt <= 1000);
  assert.match(await row.innerText(), /dash:job\s+mutex/);
  const first = await row.locator(".countdown").innerText();
  await page.waitForTimeout(400);
  const second = await row.locator(".countdown").innerText();
  assert.notEqual(first, second, "the countdown moves");
  assert.ok(parseFloat(second) < parseFloat(first), `${second} < ${first}`);
  assert.equal(await exited(run.child), 0);
  await row.waitFor({ state: "detached", timeout: 1000 });
  await page.locator("#events li.released").first().waitFor({ timeout: 1000 });
});

test("an exclusive run shows its reader-writer writer as `writer`, no slot number", async () => {
  // One key is one lock: a key first used by a --shared run is a
  // reader-writer lock, and an exclusive run of it is its writer (of a
  // fresh key, the exclusive run would be its mutex).
  const reader = await start(["run", "--shared", "--ttl", "30s", "dash:rw", "--", "sh", "-c", "echo held"], /held/);
  assert.equal(await exited(reader.child), 0);
  const run = await start(["run", "--exclusive", "--ttl", "30s", "dash:rw", "--", "sh", "-c", "echo held; sleep 2"], /held/);
  const row = page.locator('tr[data-key="dash:rw"][data-kind="writer"]');
  await row.waitFor({ timeout: 1000 });
  const shown = await row.locator("td").nth(1).innerText();
  assert.equal(shown.trim(), "writer");
  assert.equal(await exited(run.child), 0);
  await row.waitFor({ state: "detached", timeout: 1000 });
});

test("force-release is refused without the token and works with it", async () => {
  const run = await start(["run", "--ttl", "3s", "dash:admin", "--", "sh", "-c", "echo held; sleep 60"], /held/);
  const row = page.locator('tr[data-key="dash:admin"][data-kind="mutex"]');
  await row.waitFor({ timeout: 1000 });

  const bare = await fetch(base + "/api/release", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ key: "dash:admin", confirm: "dash:admin" }),
  });
  assert.equal(bare.status, 401);

  // Through the page: a wrong token first (refused), then the right one.
  const answers = ["wrong-token-123", TOKEN];
  const alerts = [];
  const onDialog = async (d) => {
    if (d.type() === "prompt") await d.accept(answers.shift());
    else if (d.type() === "confirm") await d.accept();
    else {
      alerts.push(d.message());
      await d.accept();
    }
  };
  page.on("dialog", onDialog);
  // Held down as a person holds a click (longer than the page's 100 ms
  // countdown tick): a row rebuilt in between would swallow the click.
  await row.locator("button.release").click({ delay: 300 });
  // The refusal is an alert after a prompt and a round trip to the server:
  // on a loaded CI machine that took over 2 s, so wait up to 10 s for it.
  for (let i = 0; i < 200 && alerts.length === 0; i++) await new Promise((ok) => setTimeout(ok, 50));
  assert.equal(alerts.length, 1, "refused once");
  assert.match(alerts[0], /wrong or missing admin token/);
  assert.equal(await row.count(), 1, "still held after the refusal");

  await row.locator("button.release").click({ delay: 300 });
  await row.waitFor({ state: "detached", timeout: 10000 });
  page.off("dialog", onDialog);
  // The broken holder learns it at its next renewal and stops its command.
  assert.equal(await exited(run.child), 70);
  if (process.env.LEASEHOLD_SCREENSHOT) {
    const shown = await start(["run", "--ttl", "20s", "orders:42", "--", "sh", "-c", "echo held; sleep 5"], /held/);
    await page.locator('tr[data-key="orders:42"][data-kind="mutex"]').waitFor({ timeout: 1000 });
    await page.screenshot({ path: process.env.LEASEHOLD_SCREENSHOT, fullPage: true });
    shown.child.kill("SIGTERM");
    await exited(shown.child);
  }
});

test("without --admin-token force-release is off, and the page never shows the store's password", async () => {
  const { child, match } = await start(["dashboard", "--listen", "127.0.0.1:0"], LISTENING, `sqlite://${dir}/other.db`);
  const addr = match[1];
  const res = await fetch(addr + "/api/release", {
    method: "POST",
    headers: { "content-type": "application/json", "x-admin-token": TOKEN },
    body: JSON.stringify({ key: "k", confirm: "k" }),
  });
  assert.equal(res.status, 403);
  child.kill("SIGTERM");
  // A PostgreSQL URL with a password, where the test server is there.
  const pg = process.env.LEASEHOLD_TEST_POSTGRES;
  if (pg && /:\/\/[^/]*:[^/@]+@/.test(pg)) {
    const password = decodeURIComponent(pg.match(/:\/\/[^:/]*:([^@/]+)@/)[1]);
    const { child: d, match: listening } = await start(["dashboard", "--listen", "127.0.0.1:0"], LISTENING, pg);
    const at = listening[1];
    const p = await context.newPage();
    await p.goto(at + "/");
    await p.locator("#status", { hasText: "live" }).waitFor({ timeout: 5000 });
    const html = await p.content();
    const info = await (await fetch(at + "/api/info")).text();
    assert.ok(!html.includes(password) && !info.includes(password), "no password on the page");
    await p.close();
    d.kill("SIGTERM");
  }
});
