// Usage: node check.mjs BASE_URL [API_KEY]     e.g. node check.mjs http://127.0.0.1:8080/v1
// Drives a running Strata server with OpenAI's official client and checks what comes back.
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, apiKey = process.env.STRATA_API_KEY ?? "unused"] = process.argv.slice(2);
if (!baseURL) {
  console.error("usage: node check.mjs BASE_URL [API_KEY]");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

function checkUsage(usage, completionTokensAtMost) {
  assert.ok(usage.prompt_tokens > 0);
  assert.ok(usage.completion_tokens > 0 && usage.completion_tokens <= completionTokensAtMost);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
}

const checks = {
  async models() {
    const models = [];
    for await (const model of client.models.list()) models.push(model);
    assert.equal(models.length, 1);
    return models[0].id;
  },

  async chat(model) {
    const reply = await client.chat.completions.create({
      model,
      messages: [{ role: "system", content: "You dream." }, { role: "user", content: "Once upon a time" }],
      max_tokens: 12,
      temperature: 0,
      logprobs: true,
      top_logprobs: 2,
    });
    assert.match(reply.id, /^chatcmpl-/);
    assert.equal(reply.object, "chat.completion");
    assert.equal(reply.model, model);
    const [choice] = reply.choices;
    assert.equal(choice.message.role, "assistant");
    assert.equal(typeof choice.message.content, "string");
    assert.ok(["stop", "length"].includes(choice.finish_reason));
    assert.ok(choice.logprobs.content.length > 0);
    assert.equal(choice.logprobs.content[0].top_logprobs.length, 2);
    checkUsage(reply.usage, 12);
    return reply;
  },

  async chatStream(model, whole) {
    const stream = await client.chat.completions.create({
      model,
      messages: [{ role: "system", content: "You dream." }, { role: "user", content: "Once upon a time" }],
      max_tokens: 12,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let content = "", finish = null, usage = null, first = true;
    for await (const chunk of stream) {
      assert.equal(chunk.object, "chat.completion.chunk");
      if (chunk.usage) usage = chunk.usage;
      if (chunk.choices.length === 0) continue;
      if (first) assert.equal(chunk.choices[0].delta.role, "assistant");
      first = false;
      content += chunk.choices[0].delta.content ?? "";
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    assert.equal(content, whole.choices[0].message.content, "greedy streaming matches non-streaming");
    assert.equal(finish, whole.choices[0].finish_reason);
    assert.deepEqual(usage, whole.usage);
  },

  async completion(model) {
    const reply = await client.completions.create({
      model, prompt: "Once upon a time", max_tokens: 10, temperature: 0, logprobs: 1,
    });
    assert.match(reply.id, /^cmpl-/);
    assert.equal(reply.object, "text_completion");
    const [choice] = reply.choices;
    assert.equal(typeof choice.text, "string");
    assert.equal(choice.logprobs.tokens.join(""), choice.text);
    checkUsage(reply.usage, 10);

    let streamed = "";
    const stream = await client.completions.create({
      model, prompt: "Once upon a time", max_tokens: 10, temperature: 0, stream: true,
    });
    for await (const chunk of stream) streamed += chunk.choices[0]?.text ?? "";
    assert.equal(streamed, choice.text, "greedy streaming matches non-streaming");
  },

  async errors(model) {
    await assert.rejects(
      client.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], n: 2 }),
      (error) => error instanceof OpenAI.BadRequestError && error.param === "n");
    await assert.rejects(
      client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "hi" }] }),
      (error) => error instanceof OpenAI.NotFoundError && error.code === "model_not_found");
  },
};

const model = await checks.models();
const whole = await checks.chat(model);
await checks.chatStream(model, whole);
await checks.completion(model);
await checks.errors(model);
console.log(`ok: ${baseURL} serves ${model} as the openai client expects`);
