// Tools: every tool the token may use, its descriptor and schema, a form to call it, snippets.
import { api } from "./api.js";
import { arrowKeys, clear, clip, el, fmt, pretty, snippet, toast } from "./dom.js";
import { contentBlock } from "./blocks.js";
import { schemaForm } from "./form.js";
import { openSession, releaseSession, sessions } from "./sessions.js";
import { curlSnippet, mcpServersSnippet, mcpSnippet } from "./snippets.js";

const PAGE = 100; // tools listed at once: a server with thousands stays quick to filter and draw

const meta = (tool) => (tool._meta && tool._meta.toolfactory) || {};

function newCallId() {
  if (crypto.randomUUID) return crypto.randomUUID().replace(/-/g, "");
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

export async function mount(main, args) {
  const [listed, auth] = await Promise.all([api("/v1/tools?toolset=*"), fetch("/ui/api/auth").then((r) => r.json())]);
  const tools = listed.tools.sort((a, b) => a.name.localeCompare(b.name));
  const toolsets = [...new Set(tools.flatMap((t) => meta(t).toolsets || []))].sort();
  const state = { filter: "", toolset: "", page: 0, selected: args[0] || null, tokenRequired: auth.token_required };

  const filter = el("input", { type: "search", placeholder: "filter tools (press /)", "aria-label": "filter tools", dataset: { filter: "" } });
  const toolsetSelect = el("select", { "aria-label": "toolset" }, el("option", { value: "", text: "all toolsets" }), toolsets.map((t) => el("option", { value: t, text: t })));
  const count = el("p.muted.count");
  const list = el("ul.list", { role: "listbox", "aria-label": "tools" });
  const pager = el("div.pager");
  const detail = el("section.detail", { "aria-live": "polite" });
  arrowKeys(list, "button");
  clear(main, el("div.split", {}, el("aside", {}, el("div.controls", {}, filter, toolsetSelect), count, list, pager), detail));

  const matching = () => {
    const text = state.filter.toLowerCase();
    return tools.filter((t) => (!state.toolset || (meta(t).toolsets || []).includes(state.toolset))
      && (!text || t.name.toLowerCase().includes(text) || (t.description || "").toLowerCase().includes(text) || (t.title || "").toLowerCase().includes(text)));
  };

  const drawList = () => {
    const found = matching();
    const pages = Math.max(1, Math.ceil(found.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const shown = found.slice(state.page * PAGE, (state.page + 1) * PAGE);
    count.textContent = `${found.length} of ${tools.length} tools`;
    clear(list, shown.map((t) => el("li", {}, el("button.item", {
      type: "button", role: "option", "aria-selected": String(t.name === state.selected), dataset: { tool: t.name },
      on: { click: () => { location.hash = `#/tools/${encodeURIComponent(t.name)}`; } },
    }, el("span.name", { text: t.name }), el("span.kind", { text: meta(t).kind || "" }), el("small", { text: clip((t.description || "").split("\n")[0], 90) })))));
    clear(pager, pages > 1 ? [
      el("button.small", { type: "button", text: "‹ prev", disabled: state.page === 0, on: { click: () => { state.page--; drawList(); } } }),
      ` page ${state.page + 1} of ${pages} `,
      el("button.small", { type: "button", text: "next ›", disabled: state.page >= pages - 1, on: { click: () => { state.page++; drawList(); } } }),
    ] : []);
  };

  filter.addEventListener("input", () => { state.filter = filter.value; state.page = 0; drawList(); });
  toolsetSelect.addEventListener("change", () => { state.toolset = toolsetSelect.value; state.page = 0; drawList(); });
  filter.addEventListener("keydown", (event) => { if (event.key === "ArrowDown") { event.preventDefault(); list.querySelector("button")?.focus(); } });
  const select = (name) => {
    state.selected = name;
    for (const button of list.querySelectorAll("button")) button.setAttribute("aria-selected", String(button.dataset.tool === name));
    const tool = tools.find((t) => t.name === name);
    if (tool) drawDetail(detail, tool, state);
    else clear(detail, el("p.muted", { text: name ? `no tool named ${name} (or not for this token)` : "Pick a tool on the left (arrow keys and Enter work)." }));
  };
  drawList();
  select(state.selected);
  return { update: (next) => select(next[0] || null) };
}

function toolsetOf(tool, state) {
  const sets = meta(tool).toolsets || [];
  if (state.toolset && sets.includes(state.toolset)) return state.toolset;
  return sets.includes("default") ? "default" : sets[0] || "";
}

function drawDetail(detail, tool, state) {
  const info = meta(tool);
  const form = schemaForm(tool.inputSchema);
  const raw = el("textarea.json", { rows: 6, "aria-label": "arguments as JSON", hidden: true, dataset: { raw: "" } });
  const rawToggle = el("input", { type: "checkbox", id: "raw-toggle" });
  const sessionSelect = el("select", { "aria-label": "session" });
  const result = el("div.result", { dataset: { result: "" } });
  const snippets = el("div.snippets");
  const callButton = el("button.primary", { type: "submit", text: "Call", title: "Ctrl+Enter" });

  const readArguments = () => (rawToggle.checked ? JSON.parse(raw.value || "{}") : form.read());
  const drawSessions = () => clear(sessionSelect, el("option", { value: "", text: info.stateful ? "(a throwaway session)" : "(no session)" }),
    sessions().map((s) => el("option", { value: s.id, text: s.label })));
  const toolset = toolsetOf(tool, state);
  const mcpUrl = `${location.origin}/mcp${toolset && toolset !== "default" ? `/${toolset}` : ""}`;
  const drawSnippets = () => {
    let args = {};
    try { args = readArguments(); } catch { /* keep the last good ones */ }
    const call = { call_id: newCallId(), name: tool.name, arguments: args };
    if (sessionSelect.value) call.session = sessionSelect.value;
    clear(snippets,
      snippet("curl /v1/calls", curlSnippet(location.origin, call, state.tokenRequired)),
      snippet("MCP SDK (python)", mcpSnippet(mcpUrl, tool.name, args, state.tokenRequired)),
      snippet("mcpServers block", mcpServersSnippet(mcpUrl, toolset, state.tokenRequired)));
  };
  rawToggle.addEventListener("change", () => {
    if (rawToggle.checked) {
      try { raw.value = pretty(form.read()); } catch { raw.value = "{}"; }
    }
    raw.hidden = !rawToggle.checked;
    form.node.hidden = rawToggle.checked;
  });

  const call = async (event) => {
    event.preventDefault();
    let args;
    try { args = readArguments(); } catch (error) { clear(result, el("p.error", { role: "alert", text: error.message })); return; }
    const body = { call_id: newCallId(), name: tool.name, arguments: args };
    if (sessionSelect.value) body.session = sessionSelect.value;
    callButton.disabled = true;
    clear(result, el("p.muted", { text: "calling…" }));
    const started = performance.now();
    try {
      const answer = await api("/v1/calls", { method: "POST", body: { calls: [body] } });
      drawResult(result, answer.results[0], performance.now() - started);
    } catch (error) {
      clear(result, el("p.error", { role: "alert", text: `${error.kind}: ${error.message}` }));
    } finally {
      callButton.disabled = false;
      drawSnippets();
    }
  };

  const formNode = el("form.call", { on: { submit: call, input: drawSnippets, keydown: (e) => { if (e.key === "Enter" && e.ctrlKey) call(e); } } },
    form.node, raw,
    el("div.row", {},
      el("label", { for: "raw-toggle" }, rawToggle, " edit as JSON"),
      el("label", {}, "session ", sessionSelect),
      el("button.small", { type: "button", text: "new session", on: { click: async () => { const id = await openSession(); drawSessions(); sessionSelect.value = id; toast(`session ${id} opened`); drawSnippets(); } } }),
      el("button.small", { type: "button", text: "release", on: { click: async () => { if (!sessionSelect.value) return; await releaseSession(sessionSelect.value); drawSessions(); drawSnippets(); } } }),
      callButton));

  clear(detail,
    el("h2", {}, tool.name, tool.title ? el("small", { text: ` ${tool.title}` }) : null),
    el("div.badges", {},
      [info.kind, info.stateful && "stateful", info.cacheable && "cacheable", info.idempotent === false && "not idempotent", info.timeout_s && `timeout ${info.timeout_s}s`]
        .filter(Boolean).map((b) => el("span.badge", { text: b })),
      (info.toolsets || []).map((t) => el("span.badge.toolset", { text: t }))),
    el("p.description", { text: tool.description || "" }),
    formNode,
    result,
    el("details", {}, el("summary", { text: "descriptor and schemas" }), el("pre.json", { text: pretty(tool) })),
    snippets);
  drawSessions();
  drawSnippets();
}

function drawResult(box, result, roundTripMs) {
  const status = result.is_error ? el("span.badge.bad", { text: `error: ${result.error ? result.error.kind : "tool_error"}`, dataset: { errorKind: result.error ? result.error.kind : "tool_error" } }) : el("span.badge.good", { text: "ok" });
  clear(box,
    el("div.status", {}, status,
      el("span", { dataset: { elapsed: "" }, text: ` server ${fmt(result.elapsed_ms, 2)} ms` }),
      el("span.muted", { text: ` · round trip ${fmt(roundTripMs, 1)} ms` }),
      result.cached ? el("span.badge.cache", { text: "cache hit", dataset: { cached: "" } }) : el("span.muted", { text: " · not cached" })),
    result.error ? el("p.error", { text: result.error.message }) : null,
    el("h4", { text: "content" }),
    (result.content || []).map(contentBlock),
    result.structured !== null && result.structured !== undefined ? [el("h4", { text: "structured output" }), el("pre.json", { dataset: { structured: "" }, text: pretty(result.structured) })] : null);
}
