// Drives the dashboard of a running 3-node cluster in Debian's chromium: the page asks for the
// API key, then shows the three nodes with their layers and KV use, and under a stream of
// requests every node's stage tokens/s (the others' too, not only this node's); a chat message
// streams an answer (and
// a reasoning model's stream, answered by the browser, shows its reasoning apart);
// node STRATA_KILL_PID, killed, shows as down within a few seconds. Screenshots go to
// STRATA_SCREENSHOTS.
//
// env: STRATA_URL (a node's dashboard), STRATA_API_KEY, STRATA_KILL_PID, STRATA_KILL_ID,
//      STRATA_LAYERS ("0-1 2-2 3-3": the placement's layers), STRATA_SCREENSHOTS (a folder)
import { mkdirSync } from "node:fs";
import puppeteer from "puppeteer-core";

const { STRATA_URL, STRATA_API_KEY, STRATA_KILL_PID, STRATA_KILL_ID, STRATA_LAYERS, STRATA_SCREENSHOTS } = process.env;
const failures = [];
const check = (ok, what) => {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures.push(what);
};

mkdirSync(STRATA_SCREENSHOTS, { recursive: true });
const browser = await puppeteer.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  // No sandbox: CI runs as root. Nothing may leave the machine: no name resolves but the node's.
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-domain-reliability",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"],
});
const outside = [];
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  page.on("request", (request) => {
    if (!request.url().startsWith(new URL(STRATA_URL).origin)) outside.push(request.url());
  });
  page.on("pageerror", (error) => check(false, `no script error (${error.message})`));
  await page.goto(STRATA_URL, { waitUntil: "load" });

  await page.waitForSelector("#key-form:not([hidden])", { timeout: 10000 });
  check(true, "the page asks for the API key");
  await page.type("#key-input", "not the key");
  await page.click("#key-form button");
  await page.waitForFunction(() => document.querySelector("#key-error").textContent.includes("refused"), { timeout: 10000 });
  check(true, "a wrong key is refused and the page says so");
  await page.type("#key-input", STRATA_API_KEY);
  await page.click("#key-form button");
  await page.waitForFunction(() => document.querySelectorAll("#pipeline .node").length === 3, { timeout: 15000 });
  const cards = await page.$$eval("#pipeline .node", (nodes) =>
    nodes.map((n) => ({ id: n.dataset.node, layers: n.querySelector(".layers b")?.textContent, down: n.classList.contains("down"),
                        kv: /KV \d+\/\d+ blocks/.test(n.textContent) })));
  check(cards.length === 3 && cards.every((c) => !c.down), `three nodes up in the pipeline (${JSON.stringify(cards)})`);
  check(cards.map((c) => c.layers).join(" ") === STRATA_LAYERS, `their layers are the placement's (${STRATA_LAYERS})`);
  check(cards.every((c) => c.kv), "every node shows its KV use");

  // Requests one after another from the page until every card has shown a stage speed above 0.
  await page.evaluate((key) => {
    window.loading = true;
    (async () => {
      while (window.loading) {
        await fetch("/v1/completions", {
          method: "POST",
          headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
          body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 64 }),
        }).then((r) => r.text());
      }
    })();
  }, STRATA_API_KEY);
  const speeds = await page.waitForFunction(() => {
    const shown = [...document.querySelectorAll("#pipeline .node")].map((n) => {
      const figure = /^(\d+\.\d) tokens\/s$/.exec(n.querySelector(".speed b")?.textContent ?? "");
      return figure ? Number(figure[1]) : 0;
    });
    window.fastest ||= shown.map(() => 0);
    shown.forEach((v, i) => { window.fastest[i] = Math.max(window.fastest[i], v); });
    return window.fastest.length === 3 && window.fastest.every((v) => v > 0) && window.fastest;
  }, { timeout: 20000, polling: 200 }).then((handle) => handle.jsonValue()).catch(() => null);
  await page.evaluate(() => { window.loading = false; });
  check(speeds !== null, `every node's stage tokens/s shows, above 0 under load (${JSON.stringify(speeds)})`);
  const stored = await page.evaluate(() => [sessionStorage.getItem("strata-api-key"), localStorage.length, document.cookie]);
  check(stored[0] === STRATA_API_KEY && stored[1] === 0 && stored[2] === "", "the key is kept in sessionStorage only");
  await page.screenshot({ path: `${STRATA_SCREENSHOTS}/dashboard-cluster.png`, fullPage: true });

  await page.click("#tab-chat");
  await page.type("#chat-input", "Tell me a dream.");
  await page.click("#chat-send");
  await page.waitForSelector(".message.assistant.done, .message.assistant.failed", { timeout: 30000 });
  const answer = await page.$eval(".message.assistant", (m) => ({
    text: m.querySelector(".content").textContent, meta: m.querySelector(".meta").textContent, done: m.classList.contains("done") }));
  check(answer.done && answer.text.length > 0, `a chat message streams an answer (${JSON.stringify(answer)})`);
  check(/request [0-9a-f]{16}/.test(answer.meta), "the answer names its request id");
  await page.screenshot({ path: `${STRATA_SCREENSHOTS}/dashboard-chat.png`, fullPage: true });

  // The shared model does not reason: a stream in the shape a reasoning model's takes, answered
  // for the page by the browser itself, shows that the reasoning is drawn apart from the answer.
  await page.setRequestInterception(true);
  const answerAsReasoningModel = (request) => {
    if (!request.url().endsWith("/v1/chat/completions")) return request.continue();
    const chunk = (delta) => `data: ${JSON.stringify({ choices: [{ index: 0, delta }] })}\n\n`;
    request.respond({
      status: 200,
      contentType: "text/event-stream",
      headers: { "x-request-id": "0123456789abcdef" },
      body: chunk({ role: "assistant" }) + chunk({ reasoning_content: "The user wants " }) +
            chunk({ reasoning_content: "a dream." }) + chunk({ content: "I dreamt " }) + chunk({ content: "of glass." }) +
            "data: [DONE]\n\n",
    });
  };
  page.on("request", answerAsReasoningModel);
  await page.type("#chat-input", "And another?");
  await page.click("#chat-send");
  await page.waitForFunction(() => document.querySelectorAll(".message.assistant.done, .message.assistant.failed").length === 2,
                             { timeout: 10000 });
  const reasoned = await page.$$eval(".message.assistant", (all) => ({
    reasoning: all[1].querySelector(".reasoning").textContent, content: all[1].querySelector(".content").textContent }));
  check(reasoned.reasoning === "The user wants a dream." && reasoned.content === "I dreamt of glass.",
        `reasoning_content is shown apart from the answer (${JSON.stringify(reasoned)})`);
  page.off("request", answerAsReasoningModel);
  await page.setRequestInterception(false);

  await page.click("#tab-cluster");
  await page.waitForFunction(() => document.querySelectorAll("#requests tbody tr").length >= 1, { timeout: 5000 });
  check(true, "the chat's request is among the recent requests");

  process.kill(Number(STRATA_KILL_PID), "SIGKILL");
  const killedAt = Date.now();
  await page.waitForFunction((id) => document.querySelector(`.node[data-node="${id}"]`)?.classList.contains("down"),
                             { timeout: 20000 }, STRATA_KILL_ID);
  const seconds = (Date.now() - killedAt) / 1000;
  check(seconds < 15, `the killed node ${STRATA_KILL_ID} shows as down after ${seconds.toFixed(1)} s`);
  await page.screenshot({ path: `${STRATA_SCREENSHOTS}/dashboard-node-down.png`, fullPage: true });
} catch (error) {
  check(false, `the dashboard test ran through (${error.message})`);
} finally {
  await browser.close();
}
check(outside.length === 0, `the page fetched nothing from elsewhere (${outside.join(", ")})`);
console.log(failures.length ? "FAILED" : "OK");
process.exit(failures.length ? 1 : 0);
