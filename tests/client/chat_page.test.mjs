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

// The page must show the reply while it is still arriving. Timing cannot
// prove that: the tiny model writes its 40 tokens in ~20 ms, and however the
// events are paced, a starved renderer may read them all at once (Chromium's
// network emulation, then a proxy pacing events 30 ms apart, each let the
// whole reply through in one read in CI). So this proxy forwards each request
// to the server and, in a streamed reply, lets events through only up to the
// first one that carries text; the rest, with the end of the response, wait
// until the test calls release(). A page that shows text before release()
// renders the stream as it comes. (That event may already hold most of the
// reply: the server puts into one event all the text that is ready when its
// writer wakes.)
function holdingProxy(upstream) {
  let open = false;
  const waiting = [];
  const release = () => { open = true; waiting.splice(0).forEach((f) => f()); };
  const hasText = (event) => event.split("\n").some((line) => {
    if (!line.startsWith("data: ") || line === "data: [DONE]") return false;
    return (JSON.parse(line.slice(6)).choices || []).some((c) => c.delta && (c.delta.content || c.delta.reasoning_content));
  });
  const server = http.createServer((req, res) => {
    const fwd = http.request(upstream + req.url, { method: req.method, headers: req.headers }, (up) => {
      res.writeHead(up.statusCode, up.headers);
      if (!String(up.headers["content-type"] || "").startsWith("text/event-stream")) {
        up.pipe(res);
        return;
      }
      let buf = "", textSent = false;
      const send = (text) => (open || !textSent ? res.write(text) : waiting.push(() => res.write(text)));
      up.setEncoding("utf8");
      up.on("data", (s) => {
        buf += s;
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, cut + 2);
          buf = buf.slice(cut + 2);
          send(event);
          if (hasText(event)) textSent = true;
        }
      });
      up.on("end", () => (open ? res.end(buf) : waiting.push(() => res.end(buf))));
    });
    fwd.on("error", (e) => { res.writeHead(502); res.end(String(e)); });
    req.pipe(fwd);
  });
  return new Promise((ok) => server.listen(0, "127.0.0.1", () => ok({ server, release })));
}

test("type a message, see a streamed reply", async () => {
  const { server: proxy, release } = await holdingProxy(origin);
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

    await page.type("#input", "And God said");
    await page.keyboard.press("Enter");

    // The first words are on the page while the rest of the reply is held back.
    await page.waitForFunction(() => {
      const c = document.querySelector(".msg.assistant .content");
      return c && c.textContent.length > 0;
    }, { timeout: 30_000 }).catch((e) => {
      throw new Error(`no text on the page while the rest of the reply was held back (${e.message}): ` +
                      "the page does not show the reply as it streams");
    });
    const partial = await page.$eval(".msg.assistant", (e) => ({
      text: e.querySelector(".content").textContent, streaming: e.classList.contains("streaming"),
      done: e.classList.contains("done"),
    }));
    assert.ok(partial.streaming && !partial.done, `the bubble is not marked as streaming: ${JSON.stringify(partial)}`);
    release();
    await page.waitForSelector(".msg.assistant.done", { timeout: 30_000 });

    const reply = await page.$eval(".msg.assistant .content", (e) => e.textContent);
    const user = await page.$eval(".msg.user .content", (e) => e.textContent);
    const speed = await page.$eval("#speed", (e) => e.dataset.tps);
    assert.equal(user, "And God said");
    assert.ok(reply.length > 0 && !reply.startsWith("error:"), `reply: ${reply}`);
    assert.ok(reply.startsWith(partial.text),
              `shown while streaming: ${JSON.stringify(partial.text)}, at the end: ${JSON.stringify(reply)}`);
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
