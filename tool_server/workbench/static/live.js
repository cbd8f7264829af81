// Live: the server's own /metrics as rates and percentiles, refreshed in place (no reload).
import { api } from "./api.js";
import { clear, el, fmt } from "./dom.js";
import { lineChart } from "./chart.js";

const HISTORY = 120; // samples kept for the calls/s chart

// The q-quantile of a cumulative histogram [[le, count], ...] (le null: +Inf), interpolated.
export function quantile(buckets, q) {
  const total = buckets.length ? buckets[buckets.length - 1][1] : 0;
  if (!total) return null;
  const target = q * total;
  let lower = 0;
  let below = 0;
  for (const [le, count] of buckets) {
    if (count >= target) {
      if (le === null) return lower; // in the +Inf bucket: at least the last bound
      const inBucket = count - below;
      return inBucket ? lower + ((target - below) / inBucket) * (le - lower) : le;
    }
    lower = le ?? lower;
    below = count;
  }
  return lower;
}

const windowed = (now, before) => now.map(([le, count], i) => [le, count - ((before && before[i] && before[i][1]) || 0)]);
const sum = (values) => values.reduce((a, b) => a + b, 0);

export async function mount(main) {
  let previous = null;
  let timer = null;
  const history = [];
  const interval = el("select", { "aria-label": "refresh every" }, [1, 2, 5, 10].map((s) => el("option", { value: s * 1000, text: `every ${s} s`, selected: s === 1 })));
  const pause = el("button.small", { type: "button", text: "pause" });
  const stamp = el("span.muted", { dataset: { updated: "0" } });
  const cards = el("div.cards");
  const chart = el("div");
  const tools = el("div.panel");
  const errors = el("div.panel");
  const upstreams = el("div.panel");
  clear(main, el("div.row", {}, el("h2", { text: "Live" }), interval, pause, stamp), cards, chart,
    el("div.compare", {}, tools, el("div", {}, errors, upstreams)));

  const card = (key, label, value) => el("div.card", { dataset: { metric: key } }, el("div.value", { text: value }), el("div.label", { text: label }));

  const draw = (snap, dt) => {
    const per = (now, before) => (previous && dt > 0 ? Math.max(0, now - before) / dt : null);
    const rows = Object.entries(snap.tools).map(([name, t]) => {
      const before = previous && previous.tools[name];
      const total = sum(Object.values(t.outcomes));
      const totalBefore = before ? sum(Object.values(before.outcomes)) : 0;
      const window = before ? windowed(t.buckets, before.buckets) : t.buckets;
      const recent = window.length && window[window.length - 1][1] > 0;
      const source = recent ? window : t.buckets; // no calls since the last poll: all-time figures
      return { name, total, rate: per(total, totalBefore), p50: quantile(source, 0.5), p99: quantile(source, 0.99), recent, outcomes: t.outcomes };
    }).sort((a, b) => b.total - a.total);
    const callsNow = sum(rows.map((r) => r.total));
    const callsBefore = previous ? sum(Object.values(previous.tools).map((t) => sum(Object.values(t.outcomes)))) : 0;
    const rate = per(callsNow, callsBefore);
    const g = snap.gauges;
    clear(cards,
      card("calls_per_s", "calls / s", rate === null ? "…" : fmt(rate, 1)),
      card("calls_total", "calls (all time)", fmt(callsNow)),
      card("in_flight", "running now", fmt(g.in_flight ?? 0)),
      card("queue_depth", "queue depth", fmt(g.queue_depth ?? 0)),
      card("rejected", "admissions refused (429 batches)", fmt(snap.rejected)),
      card("sessions", "sessions alive", fmt(g.sessions ?? 0)),
      card("cache_hits", "cache hits", fmt(snap.cache_hits)),
      card("connections", "connections open", fmt(g.connections_open ?? 0)));
    if (rate !== null) {
      history.push([Date.now() / 1000, rate]);
      if (history.length > HISTORY) history.shift();
      const t0 = history[0][0];
      clear(chart, lineChart([{ name: "calls/s", points: history.map(([t, r]) => [Math.round(t - t0), r]) }], { width: 900, height: 180, xLabel: "seconds", yLabel: "calls/s" }));
    }
    clear(tools, el("h3", { text: "per tool" }), el("table", {},
      el("thead", {}, el("tr", {}, ["tool", "calls/s", "calls", "errors", "p50 ms", "p99 ms"].map((h, i) => el(i ? "th.num" : "th", { text: h })))),
      el("tbody", {}, rows.map((r) => el("tr", { dataset: { toolRow: r.name } },
        el("td", { text: r.name }),
        el("td.num", { dataset: { rate: "" }, text: r.rate === null ? "…" : fmt(r.rate, 1) }),
        el("td.num", { dataset: { calls: String(r.total) }, text: fmt(r.total) }),
        el("td.num", { text: fmt(r.total - (r.outcomes.ok || 0)) }),
        el("td.num", { title: r.recent ? "since the last refresh" : "all time", text: r.p50 === null ? "–" : fmt(r.p50 * 1000, 2) }),
        el("td.num", { title: r.recent ? "since the last refresh" : "all time", text: r.p99 === null ? "–" : fmt(r.p99 * 1000, 2) }))))));
    const kinds = {};
    for (const t of Object.values(snap.tools)) for (const [kind, n] of Object.entries(t.outcomes)) if (kind !== "ok") kinds[kind] = (kinds[kind] || 0) + n;
    clear(errors, el("h3", { text: "errors by kind" }), Object.keys(kinds).length
      ? el("table", {}, el("tbody", {}, Object.entries(kinds).sort((a, b) => b[1] - a[1]).map(([k, n]) => el("tr", { dataset: { errorKind: k } }, el("td", { text: k }), el("td.num", { text: fmt(n) })))))
      : el("p.muted", { text: "none" }));
    const checks = Object.entries(snap.checks || {}).filter(([name]) => name.startsWith("upstream:"));
    clear(upstreams, el("h3", { text: "upstream servers" }), checks.length
      ? el("table", {}, el("tbody", {}, checks.map(([name, c]) => el("tr", { dataset: { upstream: name.slice(9), healthy: c.healthy ? "1" : "0" } },
        el("td", { text: name.slice(9), title: `${c.transport || ""}${c.required ? ", required: decides readiness" : ""}` }),
        el("td", { text: c.state || (c.healthy ? "up" : "down"), class: c.healthy ? "" : "error" }),
        el("td.num", { text: c.healthy ? `${fmt(c.tools ?? 0)} tools` : "" }),
        el("td.num", { text: `${fmt(c.restarts ?? 0)} restarts` }),
        el("td.muted", { text: c.healthy ? "" : c.last_error || "" })))))
      : el("p.muted", { text: "none configured" }));
  };

  const poll = async () => {
    const started = performance.now();
    try {
      const snap = await api("/ui/api/live");
      const dt = previous ? (started - previous.at) / 1000 : 0;
      draw(snap, dt);
      previous = { ...snap, at: started };
      stamp.dataset.updated = String(Number(stamp.dataset.updated) + 1);
      stamp.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      stamp.textContent = `refresh failed: ${error.message}`;
    }
    if (timer !== "stopped") timer = setTimeout(poll, Number(interval.value));
  };
  pause.addEventListener("click", () => {
    if (timer === "stopped") { timer = null; pause.textContent = "pause"; poll(); }
    else { clearTimeout(timer); timer = "stopped"; pause.textContent = "resume"; }
  });
  await poll();
  return { unmount: () => { clearTimeout(timer); timer = "stopped"; } };
}
