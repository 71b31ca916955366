// The dashboard: polls this node's /cluster, /metrics and /requests once a second, draws the
// cluster as its pipeline, and chats through /v1/chat/completions. Everything it calls is on
// the node that served it; the API key, when one is needed, stays in this tab's sessionStorage.
"use strict";

const KEY_NAME = "strata-api-key";
const POLL_MS = 1000;
const state = {
  key: sessionStorage.getItem(KEY_NAME),
  previousMetrics: null,
  stageSpeeds: {},  // node id -> {inputs, at, tokensPerSecond, heard}, from its own descriptions in /cluster
  placements: [],
  chat: [],
};

const $ = (selector) => document.querySelector(selector);

function element(tag, attributes = {}, ...children) {
  const e = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "class") e.className = value;
    else e.setAttribute(name, value);
  }
  for (const child of children) e.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return e;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

class Unauthorized extends Error {}

// A stage's layers, inclusive, as `strata cluster` writes them (/cluster's last_layer is past the end).
const layerRange = (stage) => `${stage.first_layer}-${stage.last_layer - 1}`;

async function call(path, options = {}) {
  const headers = Object.assign({}, options.headers);
  if (state.key) headers.Authorization = `Bearer ${state.key}`;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401) {
    askForKey(state.key ? "This key was refused." : "");
    throw new Unauthorized();
  }
  return response;
}

function askForKey(why) {
  $("#key-form").hidden = false;
  $("#key-error").textContent = why;
}

$("#key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.key = $("#key-input").value;
  sessionStorage.setItem(KEY_NAME, state.key);
  $("#key-input").value = "";
  $("#key-form").hidden = true;
  poll();
});

for (const tab of document.querySelectorAll(".tab")) {
  tab.addEventListener("click", () => {
    for (const other of document.querySelectorAll(".tab")) other.classList.toggle("selected", other === tab);
    for (const page of document.querySelectorAll(".page")) page.hidden = page.id !== `page-${tab.dataset.page}`;
  });
}

// The Prometheus text format's samples: {name: [{labels, value}]}.
function parseMetrics(text) {
  const samples = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const [, name, value] of (match[2] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[name] = value.replace(/\\n/g, "\n").replace(/\\(.)/g, "$1");
    }
    (samples[match[1]] ||= []).push({ labels, value: Number(match[3]) });
  }
  return samples;
}

const total = (metrics, name) => (metrics[name] || []).reduce((sum, s) => sum + s.value, 0);

function rate(name, now) {
  const before = state.previousMetrics;
  if (!before) return null;
  const seconds = (now.at - before.at) / 1000;
  return seconds > 0 ? (total(now.samples, name) - total(before.samples, name)) / seconds : null;
}

// Each node says how many inputs its stage has computed, and when (its clock): tokens/s over at
// least a second of its descriptions, which reach this node with its gossip at any moment.
const SPEED_WINDOW_MS = 1000;
const SPEED_STALE_MS = 5000;
function stageSpeed(node, now) {
  if (!node.described_unix_ms || !node.kv_cache) return null;  // no stage
  const seen = state.stageSpeeds[node.id];
  if (!seen || node.stage_inputs < seen.inputs || node.described_unix_ms < seen.at) {
    state.stageSpeeds[node.id] = { inputs: node.stage_inputs, at: node.described_unix_ms, tokensPerSecond: null, heard: now };
    return null;
  }
  if (node.described_unix_ms - seen.at >= SPEED_WINDOW_MS) {
    seen.tokensPerSecond = (node.stage_inputs - seen.inputs) * 1000 / (node.described_unix_ms - seen.at);
    seen.inputs = node.stage_inputs;
    seen.at = node.described_unix_ms;
    seen.heard = now;
  }
  return now - seen.heard > SPEED_STALE_MS ? null : seen.tokensPerSecond;
}

function nodeCard(node, stage) {
  const down = node.alive === false || node.state === "refused";
  const card = element("div", { class: `node${down ? " down" : ""}${node.self ? " self" : ""}`, "data-node": node.id });
  card.append(element("h3", {}, node.id,
                      element("span", { class: `badge ${down ? "down" : node.state === "serving" ? "up" : "busy"}` },
                              down ? "down" : node.state)));
  if (stage) card.append(element("div", { class: "row layers" }, "layers ", element("b", {}, layerRange(stage))));
  card.append(element("div", { class: "row" }, "memory ", element("b", {}, node.memory || bytes(node.memory_bytes))));
  card.append(element("div", { class: "row" }, "weights read at ", element("b", {}, `${bytes(node.weight_bytes_per_second)}/s`)));
  const kv = node.kv_cache;
  if (kv && kv.pool_blocks) {
    const share = kv.used_blocks / kv.pool_blocks;
    card.append(element("div", { class: "row" }, "KV ", element("b", {}, `${kv.used_blocks}/${kv.pool_blocks} blocks`),
                        ` (${(share * 100).toFixed(0)}%)`));
    const bar = element("div", { class: "bar" }, element("span"));
    bar.firstChild.style.width = `${Math.min(100, share * 100)}%`;
    card.append(bar);
  }
  const windowKv = kv && kv.window;  // the sliding-window layers' pool
  if (windowKv && windowKv.pool_blocks) {
    card.append(element("div", { class: "row" }, "window KV ",
                        element("b", {}, `${windowKv.used_blocks}/${windowKv.pool_blocks} blocks`)));
  }
  const speed = stageSpeed(node, Date.now());
  if (speed !== null) card.append(element("div", { class: "row speed" }, "stage ", element("b", {}, `${speed.toFixed(1)} tokens/s`)));
  if (node.problem) card.append(element("div", { class: "row" }, node.problem));
  return card;
}

function drawCluster(cluster) {
  $("#model").textContent = `${cluster.model.name} · ${cluster.model.layers} layers · node ${cluster.node_id}` +
                            (cluster.leader ? ` · leader ${cluster.leader}` : "");
  const byId = Object.fromEntries(cluster.nodes.map((n) => [n.id, n]));
  const pipeline = $("#pipeline");
  pipeline.replaceChildren();
  const stages = cluster.placement.stages || [];
  stages.forEach((stage, i) => {
    const node = byId[stage.node] || { id: stage.node, alive: false, state: "unknown" };
    if (i > 0) {
      const rtt = node.self ? byId[stages[i - 1].node]?.rtt_ms : node.rtt_ms;
      pipeline.append(element("div", { class: "link" }, element("span", { class: "arrow" }, "→"),
                              rtt ? `${rtt.toFixed(1)} ms` : ""));
    }
    pipeline.append(nodeCard(node, stage));
  });
  const placed = new Set(stages.map((s) => s.node));
  $("#others").replaceChildren(...cluster.nodes.filter((n) => !placed.has(n.id)).map((n) => nodeCard(n, null)));
  if (!stages.length) pipeline.append(element("p", {}, cluster.waiting_for || cluster.placement.error || "no placement yet"));

  const epoch = cluster.placement.epoch;
  if (epoch && !state.placements.some((p) => p.epoch === epoch)) {
    state.placements.unshift({ epoch, at: new Date(), reason: cluster.placement.reason,
                               stages: stages.map((s) => `${s.node}:${layerRange(s)}`).join(" ") });
  }
  $("#placement").replaceChildren(...state.placements.slice(0, 10).map((p) =>
    element("div", {}, element("b", {}, `epoch ${p.epoch}`), ` ${p.at.toLocaleTimeString()} · ${p.stages}`,
            p.reason ? ` · ${p.reason}` : "")));
}

function drawSummary(metrics) {
  const figure = (label, value) => element("div", { class: "figure" }, label, element("b", {}, value));
  const tokens = rate("strata_generation_tokens_total", metrics);
  const s = metrics.samples;
  $("#summary").replaceChildren(
    figure("generated here", tokens === null ? "…" : `${tokens.toFixed(1)} tokens/s`),
    figure("running", total(s, "strata_requests_running")),
    figure("waiting", total(s, "strata_requests_waiting")),
    figure("requests answered", total(s, "strata_http_requests_total")),
    figure("prefix cache hits", total(s, "strata_prefix_cache_hits_total")),
    figure("placement switches", total(s, "strata_placement_switches_total")));
}

function drawRequests(recent) {
  const longest = Math.max(0.001, ...recent.requests.map((r) => r.seconds));
  $("#requests tbody").replaceChildren(...recent.requests.map((r) => {
    const first = r.first_token_seconds ?? r.seconds;
    const queued = r.queued_seconds ?? 0;
    const span = element("div", { class: "span" }, element("span", { class: "queue" }), element("span", { class: "wait" }),
                         element("span", { class: "gen" }));
    span.children[0].style.width = `${(queued / longest) * 100}%`;
    span.children[1].style.width = `${((first - queued) / longest) * 100}%`;
    span.children[2].style.width = `${((r.seconds - first) / longest) * 100}%`;
    span.title = r.queued_seconds === null ? "queued and prefill, then decoding" : "queued, prefill, then decoding";
    return element("tr", {}, element("td", {}, r.id), element("td", { class: "timeline" }, span),
                   element("td", {}, r.prompt_tokens), element("td", {}, r.cached_tokens),
                   element("td", {}, r.generated_tokens),
                   element("td", {}, r.first_token_seconds === null ? "…" : `${(r.first_token_seconds * 1000).toFixed(0)} ms`),
                   element("td", {}, `${r.seconds.toFixed(2)} s`), element("td", {}, r.finish ?? "running"));
  }));
}

async function fetchWithin(path, ms) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), ms);
  try {
    return await call(path, { signal: abort.signal });
  } finally {
    clearTimeout(timer);
  }
}

let polling = false;
async function poll() {
  if (polling) return;
  polling = true;
  try {
    const [cluster, metricsText, recent] = await Promise.all([
      fetchWithin("/cluster", 2000).then((r) => r.json()),
      fetchWithin("/metrics", 2000).then((r) => r.text()),
      fetchWithin("/requests", 2000).then((r) => r.json()),
    ]);
    const metrics = { at: Date.now(), samples: parseMetrics(metricsText) };
    drawCluster(cluster);
    drawSummary(metrics);
    drawRequests(recent);
    state.previousMetrics = metrics;
    $("#connection").className = "badge up";
    $("#connection").textContent = "live";
  } catch (error) {
    if (!(error instanceof Unauthorized)) {
      $("#connection").className = "badge down";
      $("#connection").textContent = "this node does not answer";
    }
  } finally {
    polling = false;
  }
}

// A streamed chat answer: content and reasoning (delta.reasoning_content) apart.
async function send(text) {
  state.chat.push({ role: "user", content: text });
  $("#messages").append(element("div", { class: "message user" }, text));
  const reasoning = element("div", { class: "reasoning" });
  const content = element("div", { class: "content" });
  const meta = element("div", { class: "meta" });
  const answer = element("div", { class: "message assistant" }, reasoning, content, meta);
  $("#messages").append(answer);
  const started = performance.now();
  let firstAt = null;
  let usage = null;
  try {
    const response = await call("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages: state.chat, stream: true, stream_options: { include_usage: true } }),
    });
    const id = response.headers.get("x-request-id");
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.error?.message || `HTTP ${response.status}`);
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += value;
      let end;
      while ((end = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, end).trim();
        buffered = buffered.slice(end + 1);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        usage = chunk.usage || usage;
        for (const choice of chunk.choices || []) {
          const delta = choice.delta || {};
          if (delta.reasoning_content) reasoning.textContent += delta.reasoning_content;
          if (delta.content) content.textContent += delta.content;
          if ((delta.content || delta.reasoning_content) && firstAt === null) firstAt = performance.now();
        }
      }
    }
    state.chat.push({ role: "assistant", content: content.textContent });
    const seconds = (performance.now() - started) / 1000;
    meta.textContent = `request ${id}` + (usage ? ` · ${usage.completion_tokens} tokens in ${seconds.toFixed(2)} s` +
      ` · first after ${(((firstAt ?? performance.now()) - started) / 1000).toFixed(2)} s` +
      ` · ${usage.prompt_tokens_details?.cached_tokens ?? 0} of ${usage.prompt_tokens} prompt tokens cached` : "");
    answer.classList.add("done");
  } catch (error) {
    meta.textContent = error instanceof Unauthorized ? "the API key is needed" : `error: ${error.message}`;
    answer.classList.add("failed");
    state.chat.pop();
  }
}

$("#chat-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("#chat-input").value.trim();
  if (!text) return;
  $("#chat-input").value = "";
  send(text);
});
$("#chat-input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("#chat-form").requestSubmit();
  }
});
$("#chat-clear").addEventListener("click", () => {
  state.chat = [];
  $("#messages").replaceChildren();
});

poll();
setInterval(poll, POLL_MS);
