// Small DOM helpers shared by the pages (no framework: the pages are plain modules).

// el("div.card#id", {attrs, on: {click}}, children...)
export function el(spec, attrs = {}, ...children) {
  const [tagAndClasses, id] = spec.split("#");
  const [tag, ...classes] = tagAndClasses.split(".");
  const node = document.createElement(tag || "div");
  if (classes.length) node.className = classes.join(" ");
  if (id) node.id = id;
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "on") for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "text") node.textContent = value;
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

export function toast(message, kind = "info") {
  const box = document.getElementById("toast");
  box.textContent = message;
  box.className = `show ${kind}`;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (box.className = ""), 4000);
}

// At most `limit` characters, cut between words with an ellipsis (a description cut mid-word read as a typo).
export function clip(text, limit = 90) {
  const s = String(text ?? "");
  if (s.length <= limit) return s;
  const cut = s.slice(0, limit - 1);
  const space = cut.lastIndexOf(" ");
  return `${(space > limit / 2 ? cut.slice(0, space) : cut).replace(/[\s,;:.]+$/, "")}…`;
}

export function pretty(value) {
  return JSON.stringify(value, null, 2);
}

export function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? value.toLocaleString("en") : value.toLocaleString("en", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  return String(value);
}

// A <pre> with a copy button.
export function snippet(title, text) {
  const code = el("pre.snippet", { text, tabindex: "0" });
  const button = el("button.copy", {
    type: "button",
    text: "copy",
    "aria-label": `copy the ${title}`,
    on: {
      click: async () => {
        try {
          await navigator.clipboard.writeText(text);
          toast(`${title} copied`);
        } catch {
          const range = document.createRange();
          range.selectNodeContents(code);
          getSelection().removeAllRanges();
          getSelection().addRange(range);
          toast("select-all done: press Ctrl+C");
        }
      },
    },
  });
  return el("section.snippet-box", { dataset: { snippet: title } }, el("h4", {}, title, " ", button), code);
}

// Arrow keys move focus between the focusable items of a list (roving focus).
export function arrowKeys(container, selector) {
  container.addEventListener("keydown", (event) => {
    if (!["ArrowDown", "ArrowUp", "Home", "End"].includes(event.key)) return;
    const items = [...container.querySelectorAll(selector)];
    const at = items.indexOf(document.activeElement);
    if (at < 0) return;
    event.preventDefault();
    const next = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: items.length - 1 }[event.key];
    items[Math.max(0, Math.min(items.length - 1, next))].focus();
  });
}
