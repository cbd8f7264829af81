// One trajectory as the model saw it: tokens coloured by response_mask, the turns with each tool
// call's result, latency, cache hit and error kind, images inline, the reward and the verifier's details.
import { contentBlock } from "./blocks.js";
import { el, fmt, pretty } from "./dom.js";

// Runs of equal mask: [{ model, start, end }] (end exclusive), the same runs as the record's segments.
function runs(mask) {
  const out = [];
  mask.forEach((m, i) => {
    if (!out.length || out[out.length - 1].model !== Boolean(m)) out.push({ model: Boolean(m), start: i, end: i + 1 });
    else out[out.length - 1].end = i + 1;
  });
  return out;
}

function tokenView(record, texts) {
  const ids = record.response_ids || [];
  const mask = record.response_mask || [];
  const logprobs = record.response_logprobs || [];
  const box = el("div.tokens", { dataset: { tokens: texts ? "per-token" : "per-segment" } });
  if (texts) {
    ids.forEach((id, i) => {
      const model = Boolean(mask[i]);
      const lp = logprobs[i];
      box.append(el(`span.tok.${model ? "model" : "obs"}`, {
        dataset: { i: String(i), mask: model ? "1" : "0" },
        title: `token ${i} · id ${id} · ${model ? "model (mask 1)" : "observation (mask 0)"}${model && lp !== undefined && lp !== null ? ` · logprob ${Number(lp).toFixed(3)}` : ""}`,
        text: texts[i],
      }));
    });
  } else {
    // No tokenizer on the server: each run's decoded text (the record's segments), its token range on hover.
    const segments = record.segments || [];
    runs(mask).forEach((run, n) => {
      box.append(el(`span.tok.${run.model ? "model" : "obs"}`, {
        dataset: { start: String(run.start), end: String(run.end), mask: run.model ? "1" : "0" },
        title: `tokens ${run.start}–${run.end - 1} (${run.end - run.start} ${run.model ? "model" : "observation"} tokens) · ids ${ids.slice(run.start, Math.min(run.end, run.start + 40)).join(" ")}${run.end - run.start > 40 ? " …" : ""}`,
        text: segments[n] ? segments[n].text : `‹${run.end - run.start} tokens›`,
      }));
    });
  }
  return box;
}

// The server's figures for one call, beside its result: latency, cache hit, error kind.
function callBadges(call) {
  return el("span.call", { dataset: { call: String(call.turn), elapsed: String(call.elapsed_ms), cached: call.cached ? "1" : "0", error: call.error || "" } },
    el("span.badge", { text: `${fmt(call.elapsed_ms, 2)} ms`, title: "server-side elapsed time of the call" }),
    call.cached ? el("span.badge.cache", { text: "cache hit" }) : null,
    call.error ? el("span.badge.bad", { text: `error: ${call.error}` }) : el("span.badge.good", { text: "ok" }));
}

// Old files have no calls: a tool message that starts "Error (" is the only sign of a failure.
function turnView(message, call, images) {
  const failed = call ? Boolean(call.error) : message.role === "tool" && typeof message.content === "string" && /^Error \(/.test(message.content);
  const blocks = Array.isArray(message.content)
    ? message.content.map((block) => contentBlock(block, images))
    : el("pre", { text: typeof message.content === "string" ? message.content : pretty(message.content) });
  return el(`div.turn.${message.role}${failed ? ".failed" : ""}`, { dataset: { role: message.role } },
    el("div.role", {}, message.role === "tool" ? `tool result · ${message.name || ""}${failed ? " · failed" : ""} ` : message.role, call ? callBadges(call) : null),
    blocks,
    message.tool_calls ? el("pre.json", { text: pretty(message.tool_calls) }) : null);
}

function detailValue(value) {
  return value !== null && typeof value === "object" ? el("pre.json", { text: pretty(value) }) : fmt(value);
}

// Reward components and the verifier's details (what it matched), side by side.
function rewardView(record) {
  const components = Object.entries(record.reward_components || {});
  const details = record.reward_details && typeof record.reward_details === "object" ? Object.entries(record.reward_details) : [];
  if (!components.length && !details.length) return null;
  return el("div.reward-grid", {},
    components.length ? el("table", { dataset: { components: "" } }, el("thead", {}, el("tr", {}, el("th", { text: "reward component" }), el("th.num", { text: "value" }))),
      el("tbody", {}, components.map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td.num", { text: fmt(v) }))))) : el("p.muted", { text: "no reward components" }),
    details.length ? el("table", { dataset: { details: "" } }, el("thead", {}, el("tr", {}, el("th", { text: "verifier's details" }), el("th", { text: "" }))),
      el("tbody", {}, details.map(([k, v]) => el("tr", { dataset: { detail: k } }, el("td", { text: k }), el("td", {}, detailValue(v)))))) : el("p.muted", { text: "no verifier details in this record" }));
}

function callsTable(calls, messages) {
  if (!calls.length) return null;
  const total = calls.reduce((sum, c) => sum + (Number(c.elapsed_ms) || 0), 0);
  return el("details", { dataset: { callsTable: "" } }, el("summary", { text: `tool calls (${calls.length}, ${fmt(total, 1)} ms on the server)` }),
    el("table", {}, el("thead", {}, el("tr", {}, ["turn", "tool", "ms", "cache", "error", "result"].map((h) => el("th", { text: h })))),
      el("tbody", {}, calls.map((c) => el("tr", {}, el("td.num", { text: fmt(c.turn) }), el("td", { text: c.name }), el("td.num", { text: fmt(c.elapsed_ms, 2) }),
        el("td", { text: c.cached ? "hit" : "" }), el("td", { text: c.error || "", class: c.error ? "error" : "" }),
        el("td", { text: c.message < messages.length ? `message ${c.message}` : "not shown: the response budget ended first" }))))));
}

export function trajectoryView(answer) {
  const r = answer.record;
  const mask = r.response_mask || [];
  const model = mask.filter(Boolean).length;
  const messages = r.messages || [];
  const start = r.num_prompt_messages ?? 0;
  const metrics = r.metrics || {};
  const calls = Array.isArray(r.calls) ? r.calls : []; // absent in files written before the calls were recorded
  const byMessage = new Map(calls.map((c) => [c.message, c]));
  const images = { n: 0 }; // images numbered in the order the model saw them
  const cards = [["reward", fmt(r.reward)], ["stop reason", r.stop_reason], ["turns", fmt(r.num_turns)], ["tool calls", fmt(metrics.calls)], ["tool errors", fmt(metrics.tool_errors)],
    ["tokens model / obs", `${fmt(model)} / ${fmt(mask.length - model)}`], ["tool time s", fmt(metrics.tool_s)], ["generate s", fmt(metrics.generate_s)]];
  if (calls.length) cards.push(["cache hits", `${calls.filter((c) => c.cached).length} / ${calls.length}`]);
  const problems = answer.problems || []; // fields of the wrong type: the server left them out
  return el("div.panel", { dataset: { line: String(answer.line) } },
    problems.length ? el("p.error", { dataset: { problems: "" }, text: `malformed record: ${problems.join("; ")} (left out below)` }) : null,
    el("div.cards", {}, cards.map(([label, value]) => el("div.card", {}, el("div.value", { text: value }), el("div.label", { text: label })))),
    el("p", {}, el("b", { text: "id " }), r.id || "–", el("b", { text: " · data source " }), r.data_source || "–", el("b", { text: " · prompt " }), fmt(r.index), el("b", { text: " · sample " }), fmt(r.sample)),
    el("p", {}, el("b", { text: "final answer " }), JSON.stringify(r.final_answer), el("b", { text: " · ground truth " }), JSON.stringify(r.ground_truth)),
    r.error ? el("p.error", { text: `error: ${r.error}` }) : null,
    rewardView(r),
    metrics.verify_error ? el("p.error", { text: `verifier: ${metrics.verify_error}` }) : null,
    el("h4", { text: "as the model saw it" }),
    el("p.legend", {}, el("span.tok.model", { text: "model tokens (mask 1, trained on)" }), el("span.tok.obs", { text: "observation tokens (mask 0)" }),
      el("span.muted", { text: answer.token_texts ? "hover a token: its index, id, logprob" : "hover a run: its token range and ids (set workbench.tokenizer for single tokens)" })),
    tokenView(r, answer.token_texts),
    el("h4", { text: "turns: tool calls and their results" }),
    messages.slice(start).map((m, i) => turnView(m, byMessage.get(start + i), images)),
    callsTable(calls, messages),
    el("details", {}, el("summary", { text: `prompt (${start} messages)` }), messages.slice(0, start).map((m) => turnView(m, null, null))),
    el("details", {}, el("summary", { text: "metrics" }), el("pre.json", { text: pretty(metrics) })));
}
