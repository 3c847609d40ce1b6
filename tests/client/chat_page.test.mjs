// The chat page at / in headless Chromium (Debian's, driven by
// puppeteer-core): a person types a message and sees a reply stream in,
// with the token speed shown, and the page makes no request elsewhere.
// usage: MINFER_ORIGIN=http://127.0.0.1:PORT CHROMIUM=/usr/bin/chromium node chat_page.test.mjs
import assert from "node:assert/strict";
import { test } from "node:test";
import puppeteer from "puppeteer-core";

const origin = process.env.MINFER_ORIGIN;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
assert.ok(origin, "set MINFER_ORIGIN (http://127.0.0.1:PORT)");

test("type a message, see a streamed reply", async () => {
  const browser = await puppeteer.launch({
    executablePath, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--no-first-run"],
  });
  try {
    const page = await browser.newPage();
    const errors = [], elsewhere = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    page.on("request", (r) => { if (!r.url().startsWith(origin)) elsewhere.push(r.url()); });
    await page.goto(origin + "/", { waitUntil: "networkidle0" });
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("kjv"));
    // A slow network, so the reply is seen to grow however fast the model is:
    // the tiny model writes its 40 tokens in ~20 ms, and on loopback every
    // event would reach the page in one read. ~4 KB/s spreads the ~10 KB of
    // events over a few seconds, as a remote server's would arrive.
    // Through the page's own session, whose Network domain puppeteer has
    // enabled: sent on a fresh CDP session, the throttle once failed to hold
    // and the whole reply came in one read (CI, 2026-12-01).
    await page.emulateNetworkConditions({ latency: 20, download: 4096, upload: 65536 });
    await page.$eval("#max", (e) => { e.value = "40"; });
    await page.$eval("#temp", (e) => { e.value = "0"; });

    // Watch the reply grow: record its lengths while it streams.
    await page.evaluate(() => {
      window.__lengths = [];
      new MutationObserver(() => {
        const last = [...document.querySelectorAll(".msg.assistant .content")].pop();
        if (last) window.__lengths.push(last.textContent.length);
      }).observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
    });
    await page.type("#input", "And God said");
    await page.keyboard.press("Enter");
    await page.waitForSelector(".msg.assistant.done", { timeout: 30_000 });

    const reply = await page.$eval(".msg.assistant .content", (e) => e.textContent);
    const user = await page.$eval(".msg.user .content", (e) => e.textContent);
    const lengths = await page.evaluate(() => window.__lengths);
    const speed = await page.$eval("#speed", (e) => e.dataset.tps);
    assert.equal(user, "And God said");
    assert.ok(reply.length > 0 && !reply.startsWith("error:"), `reply: ${reply}`);
    const distinct = new Set(lengths.filter((n) => n > 0));
    assert.ok(distinct.size >= 2, `the reply arrived in one piece, not streamed: ${lengths}`);
    assert.ok(Number(speed) > 0, `no token speed shown: ${speed}`);
    assert.deepEqual(errors, []);
    assert.deepEqual(elsewhere, []);

    // The page sent what it showed: the same request over the API gives the same text.
    const sys = await page.$eval("#system", (e) => e.value);
    const r = await fetch(origin + "/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "system", content: sys }, { role: "user", content: "And God said" }],
                             max_tokens: 40, temperature: 0 }),
    });
    const j = await r.json();
    assert.equal(reply, j.choices[0].message.content);
  } finally {
    await browser.close();
  }
});
