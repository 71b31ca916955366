// Embeddings through the official clients against a real server of a synthetic Qwen3 embedding
// model: the openai client (base64 by default, and floats), the Vercel AI SDK's embedMany and
// ollama's embed give the same unit vectors, in order, with the usage the server counted.
// Usage: node embedding_clients.mjs BASE_URL API_KEY MODEL_NAME (BASE_URL without /v1)
import OpenAI from 'openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { embedMany } from 'ai';
import { Ollama } from 'ollama';
import assert from 'node:assert/strict';
import { check, report } from './checks.mjs';

const [base, apiKey, model] = process.argv.slice(2);
const texts = ['the quick brown fox', 'a cat sat on the mat', 'which node answers does not matter'];
const length = (v) => Math.sqrt(v.reduce((sum, x) => sum + x * x, 0));
const close = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < 1e-6);

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });
const reference = (await openai.embeddings.create({ model, input: texts, encoding_format: 'float' })).data;

await check('openai: embeddings.create, floats, one unit vector per input in order', async () => {
  assert.equal(reference.length, texts.length);
  reference.forEach((item, i) => {
    assert.equal(item.index, i);
    assert.equal(item.embedding.length, 128);
    assert.ok(Math.abs(length(item.embedding) - 1) < 1e-5, `length ${length(item.embedding)}`);
  });
  assert.ok(!close(reference[0].embedding, reference[1].embedding), 'different texts, different vectors');
});

await check('openai: embeddings.create with its default base64, the same vectors', async () => {
  const response = await openai.embeddings.create({ model, input: texts });
  response.data.forEach((item, i) => assert.ok(close(item.embedding, reference[i].embedding), `input ${i}`));
  assert.ok(response.usage.prompt_tokens > texts.length);
  assert.equal(response.usage.total_tokens, response.usage.prompt_tokens);
});

await check('openai: dimensions keeps the leading ones at unit length', async () => {
  const response = await openai.embeddings.create({ model, input: texts[0], dimensions: 16, encoding_format: 'float' });
  const cut = response.data[0].embedding;
  assert.equal(cut.length, 16);
  assert.ok(Math.abs(length(cut) - 1) < 1e-5);
  const lead = reference[0].embedding.slice(0, 16);
  assert.ok(close(cut, lead.map((x) => x / length(lead))));
});

await check('Vercel AI SDK: embedMany', async () => {
  const provider = createOpenAICompatible({ name: 'strata', baseURL: `${base}/v1`, apiKey });
  const { embeddings } = await embedMany({ model: provider.embeddingModel(model), values: texts });
  embeddings.forEach((vector, i) => assert.ok(close(vector, reference[i].embedding), `input ${i}`));
});

await check('ollama: embed', async () => {
  const client = new Ollama({ host: base, headers: { Authorization: `Bearer ${apiKey}` } });
  const response = await client.embed({ model, input: texts });
  response.embeddings.forEach((vector, i) => assert.ok(close(vector, reference[i].embedding), `input ${i}`));
});

await check('openai: a bad request is a 400 that says why', async () => {
  await assert.rejects(openai.embeddings.create({ model, input: '' }), (error) => {
    assert.equal(error.status, 400);
    assert.match(error.message, /nothing to embed/);
    return true;
  });
});

report();
