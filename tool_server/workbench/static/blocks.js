// MCP content blocks (a tool result's, or a tool message's in a trajectory): text, images, the rest as JSON.
import { el, pretty } from "./dom.js";

// Decoded bytes of a base64 string (no padding counted).
function decodedBytes(data) {
  const padding = data.endsWith("==") ? 2 : data.endsWith("=") ? 1 : 0;
  return Math.floor((data.length * 3) / 4) - padding;
}

export function sizeText(bytes) {
  return bytes >= 1024 * 1024 ? `${(bytes / 1024 / 1024).toFixed(1)} MB` : `${Math.max(1, Math.round(bytes / 1024))} KB`;
}

// An image block inline (no larger than its box, at most 480 px high: a 4k-pixel view does not
// push the page apart), with its type, pixel size (once decoded) and bytes under it.
export function imageBlock(block, number) {
  const label = `image${number ? ` ${number}` : ""}: ${block.mimeType || "?"}`;
  const bytes = typeof block.data === "string" ? decodedBytes(block.data) : 0;
  if (!bytes) return el("p.muted", { dataset: { content: "image" }, text: `[${label}, not stored]` }); // e.g. a verifier's copy
  const caption = el("figcaption.muted", { text: `${label}, ${sizeText(bytes)}` });
  const img = el("img.block", { src: `data:${block.mimeType};base64,${block.data}`, alt: label, loading: "lazy", dataset: { content: "image" } });
  img.addEventListener("load", () => { caption.textContent = `${label} ${img.naturalWidth}x${img.naturalHeight}, ${sizeText(bytes)}`; img.dataset.size = `${img.naturalWidth}x${img.naturalHeight}`; });
  return el("figure.image", {}, img, caption);
}

// ``count`` numbers images across a trajectory ({ n: 0 }); without it they go unnumbered.
export function contentBlock(block, count) {
  if (block && block.type === "text") return el("pre.block.text", { dataset: { content: "text" }, text: block.text });
  if (block && block.type === "image") return imageBlock(block, count ? ++count.n : 0);
  return el("pre.block", { dataset: { content: (block && block.type) || "?" }, text: pretty(block) });
}

