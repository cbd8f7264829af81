// Training: reward and success curves of local trainer runs (their metrics.jsonl), compared across runs.
import { api } from "./api.js";
import { clear, el, fmt } from "./dom.js";
import { lineChart } from "./chart.js";

const SMOOTH = 5; // steps in the moving average of the training reward

function movingAverage(points) {
  return points.map(([x], i) => {
    const window = points.slice(Math.max(0, i - SMOOTH + 1), i + 1);
    return [x, window.reduce((a, p) => a + p[1], 0) / window.length];
  });
}

const series = (records, split, key) => records.filter((r) => r.split === split && typeof r[key] === "number").map((r) => [r.step, r[key]]);

export async function mount(main) {
  const answer = await api("/ui/api/runs");
  const runs = answer.runs;
  if (!runs.length) {
    clear(main, el("h2", { text: "Training" }), el("p.muted", { text: answer.runs_dir ? `No run with a metrics.jsonl under ${answer.runs_dir}.` : "This server has no runs directory (config: workbench.runs_dir)." }));
    return {};
  }
  const chosen = new Set(runs.slice(0, 3).map((r) => r.name));
  const picker = el("fieldset.runs", {}, el("legend", { text: "runs (newest first)" }),
    runs.map((run) => el("label", { style: "display:block" },
      el("input", { type: "checkbox", value: run.name, checked: chosen.has(run.name), dataset: { run: run.name },
        on: { change: (e) => { e.target.checked ? chosen.add(run.name) : chosen.delete(run.name); draw(); } } }),
      ` ${run.name} (${describe(run)})`)));
  const charts = el("div.charts");
  const table = el("div.panel");
  const board = el("section.panel", { dataset: { tensorboard: "" } });
  clear(main, el("h2", { text: "Training" }), el("div.split", {}, el("aside", {}, picker), el("div", {}, table, charts, board)));
  const scalars = tensorboardCurves(board);

  const draw = () => {
    const selected = runs.filter((r) => chosen.has(r.name));
    const logged = selected.filter((run) => run.records.length); // TensorBoard-only runs: their scalars, below
    const reward = logged.flatMap((run) => {
      const raw = series(run.records, "train", "reward");
      return [{ name: `${run.name} (${SMOOTH}-step mean)`, points: movingAverage(raw) }, { name: `${run.name} batch`, points: raw, opacity: 0.3, hideLegend: true }];
    });
    const success = logged.flatMap((run) => [
      { name: `${run.name} held-out`, points: series(run.records, "eval", "success"), dots: true },
      { name: `${run.name} greedy`, points: series(run.records, "eval_greedy", "success"), dashed: true },
    ]).filter((s) => s.points.length);
    const first = logged[0];
    const evals = first ? first.records.filter((r) => r.split === "eval") : [];
    const kinds = [...new Set(evals.flatMap((r) => Object.keys(r).filter((k) => k.startsWith("success/"))))].sort();
    if (!logged.length) clear(charts, el("p.muted", { text: "no metrics.jsonl in the selected runs (their TensorBoard scalars are below)" }));
    else clear(charts,
      lineChart(reward.map((s, i) => ({ ...s, color: ["#2257a8", "#c0392b", "#1e7b34", "#8e44ad", "#d35400"][Math.floor(i / 2) % 5] })), { title: "training reward", xLabel: "step", yLabel: "reward", width: 820 }),
      success.length ? lineChart(success, { title: "held-out success", xLabel: "step", yLabel: "success", yMin: 0, yMax: 1, width: 820 }) : el("p.muted", { text: "no eval records" }),
      kinds.length ? lineChart(kinds.map((k) => ({ name: k.slice(8), points: series(first.records, "eval", k), dots: true })), { title: `success per kind or level: ${first.name}`, xLabel: "step", yLabel: "success", yMin: 0, yMax: 1, width: 820 }) : null);
    clear(table, el("table", { dataset: { runsTable: "" } },
      el("thead", {}, el("tr", {}, ["run", "steps", "first success", "last success", "best (step)", "train reward first → last"].map((h) => el("th", { text: h })))),
      el("tbody", {}, logged.map((run) => {
        const train = run.records.filter((r) => r.split === "train");
        const ev = run.records.filter((r) => r.split === "eval" && typeof r.success === "number");
        const best = ev.reduce((b, r) => (!b || r.success > b.success ? r : b), null);
        return el("tr", { dataset: { run: run.name } }, el("td", { text: run.name }), el("td.num", { text: fmt(train.length ? train[train.length - 1].step : 0) }),
          el("td.num", { text: fmt(ev[0]?.success) }), el("td.num", { text: fmt(ev[ev.length - 1]?.success) }),
          el("td.num", { text: best ? `${fmt(best.success)} (${best.step})` : "–" }),
          el("td.num", { text: train.length ? `${fmt(train[0].reward)} → ${fmt(train[train.length - 1].reward)}` : "–" }));
      }))));
    scalars(selected);
  };
  draw();
  return {};
}

function describe(run) {
  const parts = [];
  if (run.records.length || !run.tensorboard) parts.push(`${run.records.length} records`);
  if (run.tensorboard) parts.push(run.tensorboard.tags ? `${Object.keys(run.tensorboard.tags).length} TensorBoard tags` : "TensorBoard: unread");
  return parts.join(", ");
}

const WANTED = /reward|score|success|acc/i; // the tags drawn before any is picked
const MAX_TAGS_LISTED = 200;

// TensorBoard scalars of the selected runs: pick tags (filtered by name), one chart per tag, a line per run.
// A tag's points are fetched when it is drawn, once per run (a veRL run has hundreds of tags).
function tensorboardCurves(board) {
  const fetched = new Map(); // "run\ttag" -> points
  let picked = null; // Set of tags, null until the first draw picks the defaults
  const filter = el("input", { type: "search", placeholder: "filter tags", "aria-label": "filter TensorBoard tags", dataset: { tagFilter: "" } });
  const list = el("div.tag-list");
  const plots = el("div.charts");
  let runs = [];

  const point = async (run, tag) => {
    const key = `${run}\t${tag}`;
    if (!fetched.has(key)) fetched.set(key, api(`/ui/api/scalars?run=${encodeURIComponent(run)}&tag=${encodeURIComponent(tag)}`).then((a) => a.points));
    return fetched.get(key);
  };

  const drawPlots = async () => {
    const tags = [...picked].sort();
    const charts = await Promise.all(tags.map(async (tag) => {
      const having = runs.filter((r) => r.tensorboard.tags && tag in r.tensorboard.tags);
      const series = await Promise.all(having.map(async (r) => ({ name: r.name, points: await point(r.name, tag) })));
      const chart = lineChart(series, { title: tag, xLabel: "step", yLabel: tag.split("/").pop(), width: 820 });
      chart.dataset.tag = tag;
      return chart;
    }));
    clear(plots, charts);
  };
  const drawPlotsOrSay = () => drawPlots().catch((error) => clear(plots, el("p.error", { text: `${error.kind || "error"}: ${error.message}` })));

  const drawList = () => {
    const counts = new Map();
    for (const r of runs) for (const [tag, n] of Object.entries(r.tensorboard.tags || {})) counts.set(tag, (counts.get(tag) || 0) + n);
    const needle = filter.value.toLowerCase();
    const shown = [...counts.keys()].sort().filter((t) => t.toLowerCase().includes(needle));
    clear(list, shown.slice(0, MAX_TAGS_LISTED).map((tag) => el("label", { style: "display:block" },
      el("input", { type: "checkbox", checked: picked.has(tag), dataset: { tag },
        on: { change: (e) => { e.target.checked ? picked.add(tag) : picked.delete(tag); drawPlotsOrSay(); } } }),
      ` ${tag} (${counts.get(tag)} points)`)),
    shown.length > MAX_TAGS_LISTED ? el("p.muted", { text: `${shown.length - MAX_TAGS_LISTED} more: filter by name` }) : null);
  };
  filter.addEventListener("input", drawList);

  return (selected) => {
    runs = selected.filter((r) => r.tensorboard);
    if (!runs.length) { clear(board); return; }
    const tags = [...new Set(runs.flatMap((r) => Object.keys(r.tensorboard.tags || {})))].sort();
    if (picked === null) picked = new Set((tags.filter((t) => WANTED.test(t)).slice(0, 3).length ? tags.filter((t) => WANTED.test(t)).slice(0, 3) : tags.slice(0, 1)));
    const errors = runs.filter((r) => r.tensorboard.error).map((r) => el("p.error", { dataset: { tensorboardError: "" }, text: `${r.name}: ${r.tensorboard.error}` }));
    clear(board, el("h3", { text: "TensorBoard scalars" }), errors, el("div.split", {}, el("aside", {}, filter, list), plots));
    drawList();
    drawPlotsOrSay();
  };
}
