// Drives a running strata server with the official `openai` package, as a user's tool would.
// Usage: node openai_client.mjs BASE_URL API_KEY MODEL_NAME
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { check, report } from './checks.mjs';

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

const messages = [
  { role: 'system', content: 'You dream.' },
  { role: 'user', content: 'Once upon a time' },
];

async function streamedChat(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  let role = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      if (choice.delta.role) role = choice.delta.role;
      text += choice.delta.content ?? '';
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  return { text, finish, usage, role };
}

await check('models.list names the served model', async () => {
  const page = await client.models.list();
  assert.ok(page.data.some((m) => m.id === model), JSON.stringify(page.data));
});

await check('chat completion, not streamed', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens <= 24);
});

await check('streamed chat equals the non-streamed one (greedy), with usage', async () => {
  const plain = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  const streamed = await streamedChat({ model, messages, max_tokens: 24, temperature: 0 });
  assert.equal(streamed.role, 'assistant');
  assert.equal(streamed.text, plain.choices[0].message.content);
  assert.equal(streamed.finish, plain.choices[0].finish_reason);
  assert.deepEqual(
    [streamed.usage.prompt_tokens, streamed.usage.completion_tokens],
    [plain.usage.prompt_tokens, plain.usage.completion_tokens],
  );
});

await check('requests A, B, A: A is the same both times (greedy and seeded)', async () => {
  // The dreams model is no chat model, so plain completions give the most telling text.
  for (const sampling of [{ temperature: 0 }, { temperature: 0.9, seed: 7 }]) {
    const ask = (prompt) => client.completions.create({ model, prompt, max_tokens: 32, ...sampling });
    const a1 = await ask('Once upon a time');
    const b = await ask('The robot looked at the sky');
    const a2 = await ask('Once upon a time');
    assert.equal(a2.choices[0].text, a1.choices[0].text);
    assert.notEqual(b.choices[0].text, a1.choices[0].text);
  }
});

await check('text completion, streamed and not', async () => {
  const prompt = 'The stars whispered';
  const plain = await client.completions.create({ model, prompt, max_tokens: 20, temperature: 0 });
  assert.equal(plain.object, 'text_completion');
  const stream = await client.completions.create({ model, prompt, max_tokens: 20, temperature: 0, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, plain.choices[0].text);
});

await check('response_format json_schema: JSON of the schema, streamed and not the same', async () => {
  const schema = {
    type: 'object',
    properties: { mood: { enum: ['calm', 'wild'] }, steps: { type: 'integer', minimum: 1, maximum: 9 } },
    required: ['mood', 'steps'],
    additionalProperties: false,
  };
  const params = { model, messages, temperature: 0.7, seed: 4,
                   response_format: { type: 'json_schema', json_schema: { name: 'dream', schema, strict: true } } };
  const r = await client.chat.completions.create(params);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const value = JSON.parse(r.choices[0].message.content);
  assert.deepEqual(Object.keys(value), ['mood', 'steps']);
  assert.ok(['calm', 'wild'].includes(value.mood), r.choices[0].message.content);
  assert.ok(Number.isInteger(value.steps) && value.steps >= 1 && value.steps <= 9, r.choices[0].message.content);
  const streamed = await streamedChat(params);
  assert.equal(streamed.text, r.choices[0].message.content);
  assert.equal(streamed.finish, 'stop');
});

await check('an unsupported schema keyword is a 400 naming it', async () => {
  await assert.rejects(
    () => client.chat.completions.create({ model, messages, response_format: { type: 'json_schema',
      json_schema: { name: 'x', schema: { type: 'string', pattern: '^a' } } } }),
    (e) => e.status === 400 && /pattern/.test(e.message),
  );
});

await check('a wrong API key is refused with 401', async () => {
  const wrong = new OpenAI({ baseURL, apiKey: 'not-the-key', maxRetries: 0 });
  await assert.rejects(() => wrong.models.list(), (e) => e.status === 401);
});

await check('n = 2 is refused with 400 naming the field', async () => {
  await assert.rejects(
    () => client.chat.completions.create({ model, messages, n: 2 }),
    (e) => e.status === 400 && /\bn\b/.test(e.message),
  );
});

await check('responses.create answers what chat gives the same conversation', async () => {
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
  const response = await client.responses.create({
    model, instructions: messages[0].content, input: messages[1].content, max_output_tokens: 16, temperature: 0,
  });
  assert.equal(response.object, 'response');
  assert.match(response.id, /^resp_/);
  assert.equal(response.output_text, chat.choices[0].message.content);
  assert.equal(response.status, chat.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
  assert.equal(response.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(response.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(response.store, false);
});

await check('responses streamed events end with the same text', async () => {
  const params = { model, input: [{ role: 'user', content: [{ type: 'input_text', text: 'Once upon a time' }] }],
                   max_output_tokens: 16, temperature: 0 };
  const whole = await client.responses.create(params);
  const stream = client.responses.stream(params);
  let deltas = '';
  let sequence = -1;
  for await (const event of stream) {
    assert.equal(event.sequence_number, sequence + 1);
    sequence = event.sequence_number;
    if (event.type === 'response.output_text.delta') deltas += event.delta;
  }
  const final = await stream.finalResponse();
  assert.equal(deltas, whole.output_text);
  assert.equal(final.output_text, whole.output_text);
});

await check('responses: previous_response_id is refused with 400 naming it', async () => {
  await assert.rejects(
    () => client.responses.create({ model, input: 'hi', previous_response_id: 'resp_x' }),
    (e) => e.status === 400 && /previous_response_id/.test(e.message),
  );
});

report();
