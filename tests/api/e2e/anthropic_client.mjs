// Drives a running strata server with the official `@anthropic-ai/sdk` package, as a user's tool
// would. Usage: node anthropic_client.mjs BASE_URL API_KEY MODEL_NAME (BASE_URL without /v1)
import Anthropic from '@anthropic-ai/sdk';
import assert from 'node:assert/strict';
import { check, report } from './checks.mjs';

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

const request = {
  model,
  max_tokens: 12,
  temperature: 0,
  system: 'You dream.',
  messages: [{ role: 'user', content: 'Once upon a time' }],
};

const textOf = (message) => message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

let whole;
await check('anthropic messages.create answers a message', async () => {
  whole = await client.messages.create(request);
  assert.equal(whole.type, 'message');
  assert.equal(whole.role, 'assistant');
  assert.match(whole.id, /^msg_/);
  assert.equal(whole.stop_reason, 'max_tokens');
  assert.equal(whole.usage.output_tokens, 12);
  assert.ok(whole.usage.input_tokens > 0);
});

await check('anthropic messages.stream gives the same text as messages.create', async () => {
  const stream = client.messages.stream(request);
  const events = [];
  stream.on('streamEvent', (event) => events.push(event.type));
  const final = await stream.finalMessage();
  assert.equal(textOf(final), textOf(whole));
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 12);
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-1), 'message_stop');
  assert.ok(events.includes('content_block_delta'));
});

await check('anthropic countTokens agrees with the usage of the same prompt', async () => {
  const { system, messages } = request;
  const counted = await client.messages.countTokens({ model, system, messages });
  assert.equal(counted.input_tokens, whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
});

await check('anthropic stop_sequences end the answer before them', async () => {
  const longer = await client.messages.create({ ...request, max_tokens: 40 });
  const text = textOf(longer);
  const stop = text.slice(3, 6);
  assert.ok(stop.length > 0, `too little text to pick a stop sequence from: ${JSON.stringify(text)}`);
  const stopped = await client.messages.create({ ...request, max_tokens: 40, stop_sequences: [stop] });
  assert.equal(textOf(stopped), text.slice(0, text.indexOf(stop)));
  assert.equal(stopped.stop_reason, 'stop_sequence');
  assert.equal(stopped.stop_sequence, stop);
});

await check('anthropic errors come in its shape', async () => {
  await assert.rejects(
    client.messages.create({ ...request, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
    (error) => error instanceof Anthropic.BadRequestError && error.error?.error?.type === 'invalid_request_error' && /text only/.test(error.message));
  const wrongKey = new Anthropic({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.messages.create(request), (error) => error instanceof Anthropic.AuthenticationError);
});

report();
