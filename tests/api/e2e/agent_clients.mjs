// The other official clients run the same tool loop as tool_loop.mjs against the scripted Qwen3
// server: Anthropic's SDK (tool_use and tool_result blocks, whole and streamed), OpenAI's
// Responses API (function_call items), the Vercel AI SDK (generateText with a tool it runs) and
// Ollama's client (tool_calls with object arguments). Usage: node agent_clients.mjs BASE_URL
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, tool, stepCountIs } from 'ai';
import { Ollama } from 'ollama';
import { z } from 'zod';
import assert from 'node:assert/strict';
import { check, report } from './checks.mjs';

const [base] = process.argv.slice(2);
const model = 'scripted-qwen3';
const question = 'What is the weather in Paris?';
const parameters = {
  type: 'object',
  properties: { city: { type: 'string', description: 'The city' } },
  required: ['city'],
};

await check('anthropic: a tool_use block, then the answer from its tool_result', async () => {
  const client = new Anthropic({ baseURL: base, apiKey: 'none', maxRetries: 0 });
  const tools = [{ name: 'get_weather', description: 'The weather in a city', input_schema: parameters }];
  const messages = [{ role: 'user', content: question }];
  const first = await client.messages.create({ model, max_tokens: 200, messages, tools });
  assert.equal(first.stop_reason, 'tool_use');
  assert.deepEqual(first.content.map((b) => b.type), ['thinking', 'tool_use']);
  assert.equal(first.content[0].thinking, 'I should look the weather up.');
  const call = first.content[1];
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(call.input, { city: 'Paris' });

  const streamed = await client.messages.stream({ model, max_tokens: 200, messages, tools }).finalMessage();
  assert.deepEqual(streamed.content.map((b) => b.type), ['thinking', 'tool_use']);
  assert.deepEqual(streamed.content[1].input, { city: 'Paris' });

  const answer = await client.messages.create({
    model, max_tokens: 200, tools,
    messages: [...messages, { role: 'assistant', content: first.content },
               { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: '24 °C, sunny' }] }],
  });
  assert.equal(answer.stop_reason, 'end_turn');
  assert.match(answer.content.find((b) => b.type === 'text').text, /sunny in Paris/);
});

await check('responses: a function_call item, then the answer from its output', async () => {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
  const tools = [{ type: 'function', name: 'get_weather', description: 'The weather in a city', parameters, strict: false }];
  const first = await client.responses.create({ model, input: question, tools });
  const call = first.output.find((item) => item.type === 'function_call');
  assert.ok(call, JSON.stringify(first.output));
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });
  assert.ok(first.output.some((item) => item.type === 'reasoning'));
  const answer = await client.responses.create({
    model, tools,
    input: [{ role: 'user', content: question }, ...first.output,
            { type: 'function_call_output', call_id: call.call_id, output: '24 °C, sunny' }],
  });
  assert.match(answer.output_text, /sunny in Paris/);
});

await check('Vercel AI SDK: generateText runs the tool and answers', async () => {
  const provider = createOpenAICompatible({ name: 'strata', baseURL: `${base}/v1` });
  const seen = [];
  const result = await generateText({
    model: provider(model),
    prompt: question,
    tools: {
      get_weather: tool({
        description: 'The weather in a city',
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => { seen.push(city); return '24 °C, sunny'; },
      }),
    },
    stopWhen: stepCountIs(3),
  });
  assert.deepEqual(seen, ['Paris']);
  assert.match(result.text, /sunny in Paris/);
});

await check('ollama: chat with tools gives tool_calls with object arguments', async () => {
  const client = new Ollama({ host: base });
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters } }];
  const response = await client.chat({ model, messages: [{ role: 'user', content: question }], tools });
  assert.equal(response.message.tool_calls.length, 1);
  assert.equal(response.message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(response.message.tool_calls[0].function.arguments, { city: 'Paris' });
});

report();
