// The official OpenAI JavaScript library driving `minfer serve`, as an
// application would: chat without and with streaming, completions, a bad
// request surfacing as the library's 400 error, a wrong key as its 401.
// usage: MINFER_URL=http://127.0.0.1:PORT/v1 MINFER_API_KEY=KEY node openai_client.test.mjs
import assert from "node:assert/strict";
import { test } from "node:test";
import OpenAI from "openai";

const baseURL = process.env.MINFER_URL;
const apiKey = process.env.MINFER_API_KEY;
assert.ok(baseURL, "set MINFER_URL (http://127.0.0.1:PORT/v1)");
assert.ok(apiKey, "set MINFER_API_KEY");
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const messages = [
  { role: "system", content: "You are a preacher." },
  { role: "user", content: "And God said" },
];

test("models lists the served model, and retrieves it by id", async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(typeof list.data[0].id, "string");
  const one = await client.models.retrieve(list.data[0].id);
  assert.equal(one.id, list.data[0].id);
  await assert.rejects(client.models.retrieve("no-such-model"), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, `got ${e?.constructor?.name}: ${e}`);
    assert.equal(e.code, "model_not_found");
    return true;
  });
});

test("chat, not streamed", async () => {
  const r = await client.chat.completions.create({
    model: "minfer", messages, max_tokens: 12, temperature: 0, ignore_eos: true,
  });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
});

test("chat, streamed, equals the same request not streamed", async () => {
  const body = { model: "minfer", messages, max_tokens: 16, temperature: 0, ignore_eos: true };
  const plain = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({
    ...body, stream: true, stream_options: { include_usage: true },
  });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks >= 3, `only ${chunks} chunks`);
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
});

test("completions", async () => {
  const r = await client.completions.create({
    model: "minfer", prompt: "In the beginning", max_tokens: 8, temperature: 0, ignore_eos: true,
  });
  assert.equal(r.object, "text_completion");
  assert.ok(r.choices[0].text.length > 0);
  assert.equal(r.usage.completion_tokens, 8);
});

test("completions with a list of prompts: one choice per prompt", async () => {
  const r = await client.completions.create({
    model: "minfer", prompt: ["One", "Two"], max_tokens: 4, temperature: 0, ignore_eos: true,
  });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  assert.equal(r.usage.completion_tokens, 8);
});

test("a bad request is the library's 400 error", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "minfer", messages, temperature: 9 }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `got ${e?.constructor?.name}: ${e}`);
      assert.equal(e.status, 400);
      assert.match(e.message, /temperature/);
      assert.equal(e.param, "temperature");
      assert.ok(e.code === null || typeof e.code === "string", `code ${e.code}`);
      return true;
    });
});

test("a wrong key is the library's 401 error", async () => {
  const wrong = new OpenAI({ baseURL, apiKey: "not-the-key", maxRetries: 0 });
  await assert.rejects(
    wrong.chat.completions.create({ model: "minfer", messages, max_tokens: 2 }),
    (e) => {
      assert.ok(e instanceof OpenAI.AuthenticationError, `got ${e?.constructor?.name}: ${e}`);
      assert.equal(e.status, 401);
      return true;
    });
});
