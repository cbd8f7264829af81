// Environments: packs, their tasks by level, the gold calls as a depends_on graph, a replay of the gold.
import { api } from "./api.js";
import { arrowKeys, clear, clip, el, fmt, pretty, toast } from "./dom.js";
import { openSession } from "./sessions.js";

const NS = "http://www.w3.org/2000/svg";
const PAGE = 100;

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Gold calls in columns by depth (a call sits right of everything it depends on), arrows for depends_on.
export function goldGraph(calls) {
  const byId = Object.fromEntries(calls.map((c) => [c.id, c]));
  const depth = {};
  const depthOf = (id, seen = []) => {
    if (depth[id] !== undefined) return depth[id];
    if (seen.includes(id)) return 0;
    const deps = (byId[id]?.depends_on || []).filter((d) => byId[d]);
    depth[id] = deps.length ? 1 + Math.max(...deps.map((d) => depthOf(d, [...seen, id]))) : 0;
    return depth[id];
  };
  calls.forEach((c) => depthOf(c.id));
  const columns = [];
  for (const c of calls) (columns[depth[c.id]] ||= []).push(c);
  const W = 190, H = 46, GX = 60, GY = 18;
  const pos = {};
  columns.forEach((col, x) => col.forEach((c, y) => (pos[c.id] = { x: 10 + x * (W + GX), y: 10 + y * (H + GY) })));
  const width = 20 + columns.length * (W + GX) - GX;
  const height = 20 + Math.max(...columns.map((c) => c.length)) * (H + GY) - GY;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "gold calls and their dependencies" });
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#777" }));
  defs.append(marker);
  root.append(defs);
  for (const c of calls) for (const d of c.depends_on || []) {
    if (!pos[d]) continue;
    root.append(svg("line", { x1: pos[d].x + W, y1: pos[d].y + H / 2, x2: pos[c.id].x, y2: pos[c.id].y + H / 2, stroke: "#777", "marker-end": "url(#arrow)", "data-edge": `${d}->${c.id}` }));
  }
  for (const c of calls) {
    const g = svg("g", { "data-node": c.id });
    g.append(svg("rect", { x: pos[c.id].x, y: pos[c.id].y, width: W, height: H, rx: 5, fill: "#e8f0fc", stroke: "#2257a8" }));
    g.append(svg("text", { x: pos[c.id].x + 6, y: pos[c.id].y + 16, style: "font-weight:600" }, `${c.id}: ${c.name}`));
    const args = JSON.stringify(c.arguments);
    g.append(svg("text", { x: pos[c.id].x + 6, y: pos[c.id].y + 34 }, args.length > 28 ? `${args.slice(0, 27)}…` : args));
    g.append(svg("title", {}, `${c.name} ${args}`));
    root.append(g);
  }
  return el("div.graph", {}, root);
}

export async function mount(main, args) {
  const { packs } = await api("/ui/api/environments");
  if (!packs.length) {
    clear(main, el("h2", { text: "Environments" }), el("p.muted", { text: "This server serves no environment packs (config: environments)." }));
    return {};
  }
  const state = { pack: args[0] || packs[0].id, task: args[1] || null, level: "", filter: "" };
  const packSelect = el("select", { "aria-label": "pack" }, packs.map((p) => el("option", { value: p.id, text: `${p.id} (${p.task_count} tasks)`, selected: p.id === state.pack })));
  const levelSelect = el("select", { "aria-label": "level" });
  const filter = el("input", { type: "search", placeholder: "filter tasks (press /)", "aria-label": "filter tasks", dataset: { filter: "" } });
  const about = el("p.muted");
  const list = el("ul.list", { "aria-label": "tasks" });
  const detail = el("section.detail");
  arrowKeys(list, "button");
  clear(main, el("div.split", {}, el("aside", {}, el("div.controls", {}, packSelect, levelSelect, filter), about, list), detail));

  const pack = () => packs.find((p) => p.id === state.pack) || packs[0];
  const drawList = () => {
    const p = pack();
    const levels = {};
    for (const t of p.tasks) levels[t.level] = (levels[t.level] || 0) + 1;
    clear(levelSelect, el("option", { value: "", text: "all levels" }), Object.entries(levels).map(([l, n]) => el("option", { value: l, text: `level ${l} (${n})`, selected: String(state.level) === l })));
    about.textContent = `${p.origin} · ${p.domain || "–"} · ${p.tools.length} tools${p.prefix ? ` · prefix ${p.prefix}` : ""}. ${p.description || ""}`;
    const text = state.filter.toLowerCase();
    const tasks = p.tasks.filter((t) => (!state.level || String(t.level) === state.level) && (!text || t.id.toLowerCase().includes(text) || String(t.prompt).toLowerCase().includes(text)));
    const byLevel = {};
    for (const t of tasks.slice(0, PAGE)) (byLevel[t.level] ||= []).push(t);
    clear(list, Object.entries(byLevel).map(([level, ts]) => [
      el("li.muted", { text: `level ${level}` }),
      ts.map((t) => el("li", {}, el("button.item", { type: "button", dataset: { task: t.id }, "aria-selected": String(t.id === state.task),
        on: { click: () => { location.hash = `#/environments/${encodeURIComponent(p.id)}/${encodeURIComponent(t.id)}`; } } },
      el("span.name", { text: t.id }), el("span.kind", { text: `${t.gold.length} call${t.gold.length === 1 ? "" : "s"} · ${t.scenario}` }), el("small", { text: clip(t.prompt, 90) })))),
    ]), tasks.length > PAGE ? el("li.muted", { text: `${tasks.length - PAGE} more: filter to find them` }) : null);
  };

  const drawTask = () => {
    const p = pack();
    const task = p.tasks.find((t) => t.id === state.task);
    if (!task) { clear(detail, el("p.muted", { text: "Pick a task." })); return; }
    const replay = el("div", { dataset: { replay: "" } });
    clear(detail,
      el("h2", {}, task.id, el("small", { text: ` level ${task.level} · ${task.scenario}` })),
      el("pre.block.text", { text: String(task.prompt) }),
      el("h4", { text: `gold calls (${task.gold.length})${task.answer ? ` · answer ${JSON.stringify(task.answer)}` : ""}` }),
      goldGraph(task.gold),
      el("div.row", {},
        el("button.primary", { type: "button", text: "replay gold", on: { click: async () => drawReplay(replay, await api("/ui/api/replay", { method: "POST", body: { pack: p.id, task: task.id } })) } }),
        el("button", { type: "button", text: "open a session for this task", on: { click: async () => { const id = await openSession({ pack: p.id, task: task.id }); toast(`session ${id} opened: pick it on the Tools page`); } } })),
      replay,
      el("details", {}, el("summary", { text: "task as JSON" }), el("pre.json", { text: pretty(task) })));
  };

  packSelect.addEventListener("change", () => { location.hash = `#/environments/${encodeURIComponent(packSelect.value)}`; });
  levelSelect.addEventListener("change", () => { state.level = levelSelect.value; drawList(); });
  filter.addEventListener("input", () => { state.filter = filter.value; drawList(); });
  drawList();
  drawTask();
  return {
    update: (next) => {
      const packChanged = (next[0] || packs[0].id) !== state.pack;
      state.pack = next[0] || packs[0].id;
      state.task = next[1] || null;
      if (packChanged) state.level = "";
      drawList();
      drawTask();
    },
  };
}

function drawReplay(box, answer) {
  const r = answer.reward;
  clear(box,
    el("h4", { text: "reward of the gold (tool_use, eval mode)" }),
    el("div.cards", {}, el("div.card", { dataset: { score: String(r.score) } }, el("div.value", { text: fmt(r.score) }), el("div.label", { text: "score" })),
      Object.entries(r.components).map(([k, v]) => el("div.card", { dataset: { component: k } }, el("div.value", { text: fmt(v) }), el("div.label", { text: k })))),
    el("h4", { text: "calls" }),
    answer.calls.map((c) => el(`div.turn.tool${c.error ? ".failed" : ""}`, {}, el("div.role", { text: `${c.name} ${JSON.stringify(c.arguments)}` }), el("pre", { text: c.error ? `error: ${c.error}` : pretty(c.output) }))),
    el("h4", { text: `state changes (${answer.changes.length})` }),
    answer.changes.length ? el("table", { dataset: { changes: "" } }, el("thead", {}, el("tr", {}, ["table", "key", "before", "after"].map((h) => el("th", { text: h })))),
      el("tbody", {}, answer.changes.map((c) => el("tr", { dataset: { change: `${c.table}/${c.key}` } }, el("td", { text: c.table }), el("td", { text: c.key }),
        el("td", {}, el("pre.diff-before", { text: c.before === null ? "(absent)" : pretty(c.before) })),
        el("td", {}, el("pre.diff-after", { text: c.after === null ? "(deleted)" : pretty(c.after) })))))) : el("p.muted", { text: "the gold changes nothing (a read-only task)" }),
    el("details", {}, el("summary", { text: "verifier details" }), el("pre.json", { text: pretty(r.details) })));
}
