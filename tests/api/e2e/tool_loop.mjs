// The official `openai` client runs a tool loop against a Strata server whose model answers
// with Qwen3's tool calls (scripted_tool_server): the call comes back as OpenAI's clients expect
// it, whole and streamed, and the tool's result reaches the model.
// Usage: node tool_loop.mjs BASE_URL
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { check, report } from './checks.mjs';

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 60_000 });
const model = 'scripted-qwen3';

const parameters = {
  type: 'object',
  properties: { city: { type: 'string', description: 'The city' } },
  required: ['city'],
};
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters } }];
const question = [{ role: 'user', content: 'What is the weather in Paris?' }];

await check('a call, then the answer from its result', async () => {
  const first = await client.chat.completions.create({ model, messages: question, tools, seed: 3 });
  const choice = first.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.reasoning_content, 'I should look the weather up.');
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  assert.ok(first.usage.completion_tokens_details.reasoning_tokens > 0);

  const messages = [...question, choice.message, { role: 'tool', tool_call_id: call.id, content: '24 °C, sunny' }];
  const second = await client.chat.completions.create({ model, messages, tools, seed: 3 });
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.match(second.choices[0].message.content, /sunny in Paris/);
});

await check('the stream helper assembles the streamed call', async () => {
  const stream = client.chat.completions.stream({ model, messages: question, tools, seed: 3 });
  const argumentsDone = [];
  stream.on('tool_calls.function.arguments.done', (event) => argumentsDone.push(event));
  const completion = await stream.finalChatCompletion();
  const call = completion.choices[0].message.tool_calls[0];
  assert.equal(completion.choices[0].finish_reason, 'tool_calls');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  assert.equal(argumentsDone.length, 1);
  // The same seed: the same call id as the answer not streamed.
  const whole = await client.chat.completions.create({ model, messages: question, tools, seed: 3 });
  assert.equal(call.id, whole.choices[0].message.tool_calls[0].id);
});

await check('runTools runs the whole loop', async () => {
  const seen = [];
  const runner = client.chat.completions.runTools({
    model,
    messages: question,
    tools: [{
      type: 'function',
      function: {
        name: 'get_weather', description: 'The weather in a city', parameters,
        parse: JSON.parse,
        function: (args) => { seen.push(args); return '24 °C, sunny'; },
      },
    }],
  });
  const content = await runner.finalContent();
  assert.deepEqual(seen, [{ city: 'Paris' }]);
  assert.match(content, /sunny in Paris/);
});

await check('a tool_choice naming no tool is refused with 400', async () => {
  await assert.rejects(
    () => client.chat.completions.create({
      model, messages: question, tools, tool_choice: { type: 'function', function: { name: 'fly' } },
    }),
    (e) => e.status === 400 && /fly/.test(e.message),
  );
});

report();
