// Trajectories: a rollout JSONL paged and filtered on the server, one trajectory as the model saw it.
import { api } from "./api.js";
import { arrowKeys, clear, el, fmt, toast } from "./dom.js";
import { trajectoryView } from "./trajectory_view.js";

const PAGE = 50;
const COLUMNS = ["#", "id", "data source", "prompt", "sample", "reward", "stop", "turns", "calls", "tool errors", "tokens (model)"];

export async function mount(main, args) {
  const state = { file: args[0] || "", line: args[1] !== undefined ? Number(args[1]) : null, offset: 0, facets: null, asked: 0, shown: null };
  const fileSelect = el("select", { "aria-label": "trajectories file", dataset: { fileSelect: "" } });
  const upload = el("input", { type: "file", accept: ".jsonl,.json,application/jsonl", "aria-label": "upload a JSONL file" });
  const filters = {
    // labelled from the start: before a file is picked they were empty boxes
    data_source: el("select", { "aria-label": "data source" }, el("option", { value: "", text: "data source: any" })),
    stop_reason: el("select", { "aria-label": "stop reason" }, el("option", { value: "", text: "stop reason: any" })),
    min_reward: el("input", { type: "number", step: "any", placeholder: "min reward", "aria-label": "min reward", size: 8 }),
    max_reward: el("input", { type: "number", step: "any", placeholder: "max reward", "aria-label": "max reward", size: 8 }),
    tool_errors: el("select", { "aria-label": "tool errors" }, el("option", { value: "", text: "tool errors: any" }), el("option", { value: "yes", text: "with tool errors" }), el("option", { value: "no", text: "without tool errors" })),
    q: el("input", { type: "search", placeholder: "trajectory id (press /)", "aria-label": "trajectory id", dataset: { filter: "" } }),
  };
  const count = el("span.muted", { dataset: { count: "" } });
  const notice = el("p.error", { dataset: { indexNotice: "" } }); // the index stops short of the file's end
  const table = el("div.panel.table-box");
  const pager = el("div.pager");
  const detail = el("section", { dataset: { trajectory: "" } });
  clear(main,
    el("div.row", {}, el("h2", { text: "Trajectories" }), fileSelect, el("label", {}, "or upload ", upload)),
    el("div.row.filters", {}, Object.values(filters), count),
    notice, table, pager, detail);

  const listing = await api("/ui/api/files");
  const drawFiles = (files) => clear(fileSelect, el("option", { value: "", text: files.length ? "pick a file…" : listing.runs_dir ? `no .jsonl under ${listing.runs_dir}` : "no runs directory: upload a file" }),
    files.map((f) => el("option", { value: f.name, text: `${f.name} (${fmt(f.bytes)} bytes)`, selected: f.name === state.file })));
  drawFiles(listing.files);
  if (state.file && !listing.files.some((f) => f.name === state.file)) fileSelect.append(el("option", { value: state.file, text: state.file, selected: true }));

  const query = () => {
    const params = new URLSearchParams({ file: state.file, offset: state.offset, limit: PAGE });
    for (const [key, input] of Object.entries(filters)) if (input.value !== "") params.set(key, input.value);
    return params;
  };

  const drawFacets = (facets) => {
    if (state.facets) return;
    state.facets = facets;
    const options = (name, counts) => [el("option", { value: "", text: `${name}: any` }), Object.entries(counts).map(([v, n]) => el("option", { value: v, text: `${v} (${n})` }))];
    clear(filters.data_source, options("data source", facets.data_source));
    clear(filters.stop_reason, options("stop reason", facets.stop_reason));
  };

  const drawTable = async () => {
    if (!state.file) {
      clear(table, el("p.muted", { text: "Open a trajectories JSONL (written by trainer-client rollout or the demo)." }));
      return;
    }
    const wanted = query().toString();
    if (wanted === state.shown) return; // the same page (a second change event): keep the rows and focus
    const asked = ++state.asked;
    const page = await api(`/ui/api/trajectories?${wanted}`);
    if (asked !== state.asked) return; // a later filter change is on its way: drop this answer
    state.shown = wanted;
    drawFacets(page.facets);
    count.textContent = `${fmt(page.matching)} of ${fmt(page.total)} trajectories`;
    notice.textContent = (page.index && page.index.truncated) || "";
    const body = el("tbody", {}, page.rows.map((r) => el("tr.row-link", {
      tabindex: "0", dataset: { line: String(r.line) }, "aria-current": r.line === state.line ? "true" : null,
      on: { click: () => open(r.line), keydown: (e) => { if (e.key === "Enter") open(r.line); } },
    }, el("td.num", { text: r.line }), el("td", { text: String(r.id ?? "").slice(0, 14), title: String(r.id ?? "") }), el("td", { text: r.data_source }),
      el("td.num", { text: fmt(r.index) }), el("td.num", { text: fmt(r.sample) }), el("td.num", { text: fmt(r.reward) }),
      el("td", { class: r.error ? "error" : "", title: r.error || "" }, r.stop_reason,
        r.malformed ? [" ", el("span.badge.bad", { text: "malformed", title: r.error || "", dataset: { malformed: "" } })] : null), el("td.num", { text: fmt(r.num_turns) }), el("td.num", { text: fmt(r.tool_calls) }),
      el("td.num", { text: fmt(r.tool_errors), class: r.tool_errors ? "error" : "" }), el("td.num", { text: `${fmt(r.tokens)} (${fmt(r.model_tokens)})` }))));
    arrowKeys(body, "tr");
    clear(table, el("table", {}, el("thead", {}, el("tr", {}, COLUMNS.map((c) => el("th", { text: c })))), body));
    const pages = Math.max(1, Math.ceil(page.matching / PAGE));
    const at = Math.floor(state.offset / PAGE);
    clear(pager, el("button.small", { type: "button", text: "‹ prev", disabled: at === 0, on: { click: () => { state.offset -= PAGE; drawTable(); } } }),
      ` page ${at + 1} of ${pages} `,
      el("button.small", { type: "button", text: "next ›", disabled: at >= pages - 1, on: { click: () => { state.offset += PAGE; drawTable(); } } }));
  };

  const open = (line) => { location.hash = `#/trajectories/${encodeURIComponent(state.file)}/${line}`; };

  const drawDetail = async () => {
    if (state.line === null || !state.file) { clear(detail); return; }
    const answer = await api(`/ui/api/trajectory?file=${encodeURIComponent(state.file)}&line=${state.line}`);
    const compare = el("div");
    const pick = el("select", { "aria-label": "compare with another sample of this prompt", dataset: { compare: "" } },
      el("option", { value: "", text: answer.siblings.length ? "compare with another sample of this prompt…" : "no other sample of this prompt" }),
      answer.siblings.map((n) => el("option", { value: n, text: `trajectory ${n}` })));
    pick.addEventListener("change", async () => {
      if (pick.value === "") { clear(compare); detail.querySelector(".compare-grid")?.classList.remove("compare"); return; }
      const other = await api(`/ui/api/trajectory?file=${encodeURIComponent(state.file)}&line=${pick.value}`);
      clear(compare, trajectoryView(other));
      grid.classList.add("compare");
    });
    const grid = el("div.compare-grid", {}, el("div", {}, trajectoryView(answer)), compare);
    clear(detail, el("div.row", {}, el("h3", { text: `trajectory ${state.line}` }), pick), grid);
  };

  fileSelect.addEventListener("change", () => { location.hash = fileSelect.value ? `#/trajectories/${encodeURIComponent(fileSelect.value)}` : "#/trajectories"; });
  upload.addEventListener("change", async () => {
    const file = upload.files[0];
    if (!file) return;
    const answer = await api(`/ui/api/upload?name=${encodeURIComponent(file.name)}`, { method: "POST", body: file, raw: true });
    toast(`${file.name} uploaded`);
    fileSelect.append(el("option", { value: answer.file, text: answer.file }));
    location.hash = `#/trajectories/${encodeURIComponent(answer.file)}`;
  });
  for (const input of Object.values(filters)) input.addEventListener("change", () => { state.offset = 0; drawTable(); });
  filters.q.addEventListener("input", () => { state.offset = 0; drawTable(); });

  await drawTable();
  await drawDetail();
  return {
    update: async (next) => {
      const file = next[0] || "";
      const line = next[1] !== undefined ? Number(next[1]) : null;
      if (file !== state.file) {
        Object.assign(state, { file, line, offset: 0, facets: null, shown: null });
        fileSelect.value = file;
        for (const input of Object.values(filters)) input.value = "";
        await drawTable();
      } else {
        state.line = line;
        for (const row of table.querySelectorAll("tr[data-line]")) row.toggleAttribute("aria-current", Number(row.dataset.line) === line);
      }
      await drawDetail();
      detail.scrollIntoView({ block: "start" });
    },
  };
}
