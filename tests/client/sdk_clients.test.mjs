// Two more client libraries applications use for structured output, driving
// `minfer serve` as they drive any OpenAI-compatible server: the Vercel AI
// SDK (generateObject, streamObject, generateText with toolChoice
// "required") through its OpenAI-compatible provider, and LangChain's
// ChatOpenAI.withStructuredOutput in its three methods (jsonSchema,
// functionCalling, jsonMode). Each builds its own request shape (its own
// response_format, tools and tool_choice); only the server's grammar makes
// the built-in model's replies parse.
// usage: MINFER_URL=http://127.0.0.1:PORT/v1 MINFER_API_KEY=KEY node --test sdk_clients.test.mjs
import assert from "node:assert/strict";
import { test } from "node:test";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { ChatOpenAI } from "@langchain/openai";
import { generateObject, generateText, streamObject, tool } from "ai";
import { z } from "zod";

const baseURL = process.env.MINFER_URL;
const apiKey = process.env.MINFER_API_KEY;
assert.ok(baseURL, "set MINFER_URL (http://127.0.0.1:PORT/v1)");
assert.ok(apiKey, "set MINFER_API_KEY");

const Verdict = z.object({
  verdict: z.enum(["yea", "nay"]),
  count: z.number().int().min(0).max(99),
  word: z.string().max(6),
  amen: z.boolean(),
});
const Weather = z.object({
  city: z.enum(["Jerusalem", "Babylon"]),
  days: z.number().int().min(1).max(7),
});
const prompt = "Shall the meek inherit the earth? Answer in JSON.";

// ---- Vercel AI SDK ----
// supportsStructuredOutputs: the provider sends the schema as a json_schema
// response_format (without it, a bare json_object and the schema in the prompt).
const provider = createOpenAICompatible({
  name: "minfer", baseURL, apiKey, supportsStructuredOutputs: true,
});
const model = provider.chatModel("minfer");

test("AI SDK generateObject: the object matches the zod schema", async () => {
  const r = await generateObject({
    model, schema: Verdict, schemaName: "verdict", prompt,
    maxOutputTokens: 120, temperature: 0, maxRetries: 0,
  });
  assert.equal(r.finishReason, "stop");
  assert.deepEqual(Verdict.parse(r.object), r.object);
  assert.ok(r.usage.outputTokens > 0);
});

test("AI SDK streamObject: the streamed object is the schema's, partials along the way", async () => {
  const s = streamObject({
    model, schema: Verdict, schemaName: "verdict", prompt,
    maxOutputTokens: 120, temperature: 0.8, seed: 5, maxRetries: 0,
  });
  let partials = 0;
  for await (const _ of s.partialObjectStream) partials++;
  const object = await s.object;
  assert.ok(partials >= 2, `only ${partials} partial objects`);
  assert.deepEqual(Verdict.parse(object), object);
});

test("AI SDK generateText with toolChoice required: a call of one of the tools", async () => {
  const r = await generateText({
    model, prompt, maxOutputTokens: 120, temperature: 0, maxRetries: 0,
    tools: {
      get_weather: tool({ description: "The weather in a city", inputSchema: Weather }),
      get_time: tool({ inputSchema: z.object({ tz: z.enum(["UTC", "CET"]) }) }),
    },
    toolChoice: "required",
  });
  assert.equal(r.finishReason, "tool-calls");
  assert.ok(r.toolCalls.length >= 1);
  for (const call of r.toolCalls) {
    if (call.toolName === "get_weather") Weather.parse(call.input);
    else assert.ok(call.toolName === "get_time" && ["UTC", "CET"].includes(call.input.tz),
                   JSON.stringify(call));
  }
});

test("AI SDK generateText with a named tool: that tool is called", async () => {
  const r = await generateText({
    model, prompt, maxOutputTokens: 120, temperature: 0, maxRetries: 0,
    tools: {
      get_weather: tool({ inputSchema: Weather }),
      get_time: tool({ inputSchema: z.object({ tz: z.enum(["UTC", "CET"]) }) }),
    },
    toolChoice: { type: "tool", toolName: "get_time" },
  });
  assert.equal(r.toolCalls.length, 1);
  assert.equal(r.toolCalls[0].toolName, "get_time");
  assert.ok(["UTC", "CET"].includes(r.toolCalls[0].input.tz));
});

// ---- LangChain ----
const llm = new ChatOpenAI({
  model: "minfer", apiKey, configuration: { baseURL }, temperature: 0, maxTokens: 120,
  maxRetries: 0,
});

test("LangChain withStructuredOutput, method jsonSchema", async () => {
  const r = await llm.withStructuredOutput(Verdict, { method: "jsonSchema", name: "verdict" })
    .invoke(prompt);
  assert.deepEqual(Verdict.parse(r), r);
});

test("LangChain withStructuredOutput, method functionCalling (a forced tool call)", async () => {
  const r = await llm
    .withStructuredOutput(Verdict, { method: "functionCalling", name: "verdict", includeRaw: true })
    .invoke(prompt);
  assert.equal(r.raw.tool_calls.length, 1, JSON.stringify(r.raw));
  assert.equal(r.raw.tool_calls[0].name, "verdict");
  assert.deepEqual(Verdict.parse(r.parsed), r.parsed);
});

test("LangChain withStructuredOutput, method jsonMode: a JSON object", async () => {
  // json_object mode promises JSON, not the schema (the schema only reaches
  // the model through the prompt, which this one cannot read): the raw reply
  // must be an object, the schema's parse may fail.
  const r = await llm.withStructuredOutput(Verdict, { method: "jsonMode", includeRaw: true })
    .invoke(prompt);
  const value = JSON.parse(r.raw.content);
  assert.equal(typeof value, "object");
  assert.ok(value !== null && !Array.isArray(value), r.raw.content);
});
