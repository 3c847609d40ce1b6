// The chat page at / in headless Chromium (Debian's, driven by
// puppeteer-core): a person types a message and sees a reply stream in,
// with the token speed shown, and the page makes no request elsewhere.
// usage: MINFER_ORIGIN=http://127.0.0.1:PORT CHROMIUM=/usr/bin/chromium node chat_page.test.mjs
import assert from "node:assert/strict";
import { test } from "node:test";
import http from "node:http";
import puppeteer from "puppeteer-core";

const origin = process.env.MINFER_ORIGIN;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
assert.ok(origin, "set MINFER_ORIGIN (http://127.0.0.1:PORT)");

// A slow network between the page and the server, so the reply is seen to
// grow however fast the model is: the tiny model writes its 40 tokens in
// ~20 ms, and on loopback every event would reach the page in one read.
// This proxy forwards each request to the server and sends a streamed
// reply's events (the text up to each blank line) 30 ms apart, as a remote
// server's would arrive. (Chromium's network emulation was tried first; twice
// in CI it let the whole reply through in one read.)
function pacedProxy(upstream, gapMs) {
  const server = http.createServer((req, res) => {
    const fwd = http.request(upstream + req.url, { method: req.method, headers: req.headers }, (up) => {
      res.writeHead(up.statusCode, up.headers);
      if (!String(up.headers["content-type"] || "").startsWith("text/event-stream")) {
        up.pipe(res);
        return;
      }
      let buf = "", queue = Promise.resolve();
      const later = (text) => {
        queue = queue.then(() => new Promise((ok) => setTimeout(() => { res.write(text); ok(); }, gapMs)));
      };
      up.setEncoding("utf8");
      up.on("data", (s) => {
        buf += s;
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          later(buf.slice(0, cut + 2));
          buf = buf.slice(cut + 2);
        }
      });
      up.on("end", () => { queue = queue.then(() => res.end(buf)); });
    });
    fwd.on("error", (e) => { res.writeHead(502); res.end(String(e)); });
    req.pipe(fwd);
  });
  return new Promise((ok) => server.listen(0, "127.0.0.1", () => ok(server)));
}

test("type a message, see a streamed reply", async () => {
  const proxy = await pacedProxy(origin, 30);
  const pageOrigin = `http://127.0.0.1:${proxy.address().port}`;
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
    page.on("request", (r) => { if (!r.url().startsWith(pageOrigin)) elsewhere.push(r.url()); });
    await page.goto(pageOrigin + "/", { waitUntil: "networkidle0" });
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("kjv"));
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
    proxy.closeAllConnections();
    proxy.close();
  }
});
