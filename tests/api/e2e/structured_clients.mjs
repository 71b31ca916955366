// Structured output through the official clients against the real shared 260K model (which knows
// nothing of JSON): the openai client's zod response format, the Vercel AI SDK's generateObject
// and Ollama's format each give an object that their own schema accepts.
// Usage: node structured_clients.mjs BASE_URL API_KEY MODEL_NAME (BASE_URL without /v1)
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateObject } from 'ai';
import { Ollama } from 'ollama';
import { z } from 'zod';
import assert from 'node:assert/strict';
import { check, report } from './checks.mjs';

const [base, apiKey, model] = process.argv.slice(2);
const Dream = z.object({ mood: z.enum(['calm', 'wild']), stars: z.number().int().min(0).max(9) });
const messages = [{ role: 'user', content: 'A dream' }];

await check('openai: a zod response format parses into its schema', async () => {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });
  const completion = await client.chat.completions.parse({
    model, messages, temperature: 0, max_tokens: 40, response_format: zodResponseFormat(Dream, 'dream'),
  });
  const parsed = completion.choices[0].message.parsed;
  assert.deepEqual(Dream.parse(parsed), parsed);
});

await check('Vercel AI SDK: generateObject with a zod schema', async () => {
  const provider = createOpenAICompatible({ name: 'strata', baseURL: `${base}/v1`, apiKey, supportsStructuredOutputs: true });
  const { object } = await generateObject({ model: provider(model), schema: Dream, prompt: 'A dream', temperature: 0, maxOutputTokens: 40 });
  assert.deepEqual(Dream.parse(object), object);
});

await check('ollama: chat with a format schema', async () => {
  const client = new Ollama({ host: base, headers: { Authorization: `Bearer ${apiKey}` } });
  const response = await client.chat({
    model, messages, format: z.toJSONSchema(Dream), options: { temperature: 0, num_predict: 40 },
  });
  const object = JSON.parse(response.message.content);
  assert.deepEqual(Dream.parse(object), object);
});

report();
