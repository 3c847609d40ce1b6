// The official OpenAI JavaScript library driving `minfer serve`, as an
// application would: chat without and with streaming, completions, a bad
// request surfacing as the library's 400 error, a wrong key as its 401;
// structured output through the library's zod helpers and forced tool calls.
// usage: MINFER_URL=http://127.0.0.1:PORT/v1 MINFER_API_KEY=KEY node openai_client.test.mjs
import assert from "node:assert/strict";
import { test } from "node:test";
import OpenAI from "openai";
import { zodFunction, zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";

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

// ---- Structured output (issue 31) ----
// The library's own structured-output helpers: a zod schema sent as
// response_format (zodResponseFormat) and parsed back by `parse`, streamed
// and not; forced tool calls. The built-in model knows nothing of JSON:
// only the server's grammar makes these replies parse.

const Verdict = z.object({
  verdict: z.enum(["yea", "nay"]),
  count: z.number().int().min(0).max(99),
  word: z.string().max(6),
  amen: z.boolean(),
});
const ask = [{ role: "user", content: "Shall the meek inherit the earth? Answer in JSON." }];
// parse() is under beta in the 4.x library and at the top in 5.x.
const completions = client.chat.completions.parse ? client.chat.completions
                                                  : client.beta.chat.completions;

test("parse with a zod response_format, not streamed", async () => {
  const r = await completions.parse({
    model: "minfer", messages: ask, max_tokens: 120, temperature: 0,
    response_format: zodResponseFormat(Verdict, "verdict"),
  });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, "stop", m.content);
  assert.deepEqual(Verdict.parse(JSON.parse(m.content)), m.parsed);
  assert.ok(["yea", "nay"].includes(m.parsed.verdict));
  assert.ok(m.parsed.word.length <= 6);
});

test("parse with a zod response_format, streamed, equals not streamed", async () => {
  const body = {
    model: "minfer", messages: ask, max_tokens: 120, temperature: 0.8, seed: 7,
    response_format: zodResponseFormat(Verdict, "verdict"),
  };
  const plain = await completions.parse(body);
  const stream = client.beta.chat.completions.stream(body);
  let chunks = 0;
  for await (const _ of stream) chunks++;
  const r = await stream.finalChatCompletion();
  assert.ok(chunks >= 3, `only ${chunks} chunks`);
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.deepEqual(Verdict.parse(r.choices[0].message.parsed), r.choices[0].message.parsed);
  assert.equal(r.choices[0].message.content, plain.choices[0].message.content);
});

const Weather = z.object({ city: z.enum(["Jerusalem", "Babylon"]), days: z.number().int().min(1).max(7) });
const weatherTool = {
  type: "function",
  function: { name: "get_weather", description: "The weather in a city",
              parameters: zodResponseFormat(Weather, "w").json_schema.schema },
};
const timeTool = {
  type: "function",
  function: { name: "get_time", parameters: { type: "object",
    properties: { tz: { enum: ["UTC", "CET"] } }, required: ["tz"], additionalProperties: false } },
};

test("tool_choice required: a call of one of the tools, not streamed", async () => {
  const r = await client.chat.completions.create({
    model: "minfer", messages: ask, max_tokens: 120, temperature: 0,
    tools: [weatherTool, timeTool], tool_choice: "required", parallel_tool_calls: false,
  });
  const c = r.choices[0];
  assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, "function");
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === "get_weather") Weather.parse(args);
  else assert.ok(call.function.name === "get_time" && ["UTC", "CET"].includes(args.tz), JSON.stringify(call));
});

test("tool_choice required, streamed: the call comes in the deltas", async () => {
  const stream = await client.chat.completions.create({
    model: "minfer", messages: ask, max_tokens: 200, temperature: 0.8, seed: 3,
    tools: [weatherTool, timeTool], tool_choice: "required", stream: true,
  });
  const calls = [];
  let finish = null, content = "";
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      content += c.delta?.content ?? "";
      for (const t of c.delta?.tool_calls ?? []) {
        calls[t.index] ??= { name: "", arguments: "" };
        calls[t.index].name += t.function?.name ?? "";
        calls[t.index].arguments += t.function?.arguments ?? "";
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(finish, "tool_calls");
  assert.equal(content, "");
  assert.ok(calls.length >= 1);
  for (const call of calls) {
    const args = JSON.parse(call.arguments);
    if (call.name === "get_weather") Weather.parse(args);
    else assert.ok(call.name === "get_time" && ["UTC", "CET"].includes(args.tz), JSON.stringify(call));
  }
});

test("a named function with parse and zodFunction: parsed_arguments", async () => {
  const r = await completions.parse({
    model: "minfer", messages: ask, max_tokens: 120, temperature: 0,
    tools: [zodFunction({ name: "get_weather", parameters: Weather })],
    tool_choice: { type: "function", function: { name: "get_weather" } },
    parallel_tool_calls: false,
  });
  const call = r.choices[0].message.tool_calls[0];
  assert.equal(r.choices[0].finish_reason, "tool_calls");
  assert.equal(call.function.name, "get_weather");
  assert.deepEqual(call.function.parsed_arguments, Weather.parse(JSON.parse(call.function.arguments)));
});

test("a schema the server cannot enforce is the library's 400, naming the keyword", async () => {
  await assert.rejects(
    completions.parse({
      model: "minfer", messages: ask, max_tokens: 8,
      response_format: { type: "json_schema", json_schema: { name: "x", strict: true,
        schema: { type: "object", properties: { n: { type: "integer", multipleOf: 3 } } } } },
    }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `got ${e?.constructor?.name}: ${e}`);
      assert.match(e.message, /multipleOf/);
      assert.equal(e.param, "response_format.json_schema.schema");
      return true;
    });
});
