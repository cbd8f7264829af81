// The workbench shell: hash routing between pages, the token dialog, keyboard shortcuts.
import { setToken, token, tokenRequired, ApiError } from "./api.js";
import { clear, el, toast } from "./dom.js";

const PAGES = {
  tools: () => import("./tools.js"),
  environments: () => import("./environments.js"),
  trajectories: () => import("./trajectories.js"),
  live: () => import("./live.js"),
  training: () => import("./training.js"),
};

let current = null; // { name, handle }: the mounted page; handle.update(args) / handle.unmount()
let navigation = 0; // counts show() calls: a page still mounting when the next one starts is dropped

function route() {
  const [name, ...rest] = (location.hash.replace(/^#\/?/, "") || "tools").split("/");
  return { name: PAGES[name] ? name : "tools", args: rest.map(decodeURIComponent) };
}

async function show() {
  const { name, args } = route();
  if (current && current.name === name && current.handle && current.handle.update) {
    current.handle.update(args); // same page, another item: keep its filters and scroll
    return;
  }
  if (current && current.handle && current.handle.unmount) current.handle.unmount();
  current = null;
  for (const link of document.querySelectorAll("nav a")) {
    link.toggleAttribute("aria-current", link.dataset.page === name);
  }
  // Each navigation mounts into its own element: a page whose mount is still awaiting its data
  // when the user moves on draws into an element no longer shown, never over the next page.
  const mine = ++navigation;
  const view = el("div", {}, el("p.muted", { text: "loading…" }));
  clear(document.getElementById("main"), view);
  document.title = `${name} · toolfactory workbench`;
  try {
    const page = await PAGES[name]();
    const handle = await page.mount(view, args);
    if (mine !== navigation) {
      if (handle && handle.unmount) handle.unmount(); // superseded: stop its timers
      return;
    }
    current = { name, handle };
  } catch (error) {
    clear(view, el("p.error", { role: "alert", text: `${error.kind || "error"}: ${error.message}` }));
    if (!(error instanceof ApiError)) throw error;
  }
}

function askToken(message = "") {
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-error").textContent = message;
  const input = document.getElementById("token-input");
  input.value = token();
  if (!dialog.open) dialog.showModal();
  input.focus();
}

function setupToken() {
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-form").addEventListener("submit", () => {
    setToken(document.getElementById("token-input").value.trim());
    show();
  });
  document.getElementById("token-cancel").addEventListener("click", () => dialog.close());
  document.getElementById("token-button").addEventListener("click", () => askToken());
  window.addEventListener("unauthorized", (event) => askToken(event.detail.message));
}

function setupKeys() {
  document.addEventListener("keydown", (event) => {
    const typing = event.target.closest("input, textarea, select, [contenteditable]");
    if (event.key === "/" && !typing) {
      const filter = document.querySelector("[data-filter]");
      if (filter) {
        event.preventDefault();
        filter.focus();
      }
    } else if (event.altKey && /^[1-5]$/.test(event.key)) {
      event.preventDefault();
      location.hash = document.querySelectorAll("nav a")[Number(event.key) - 1].getAttribute("href");
    }
  });
}

async function start() {
  setupToken();
  setupKeys();
  window.addEventListener("hashchange", show);
  if ((await tokenRequired()) && !token()) {
    askToken();
    return;
  }
  await show();
}

window.addEventListener("unhandledrejection", (event) => toast(String(event.reason), "error"));
start();
