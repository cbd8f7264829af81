// A small SVG line chart (hand-written: a few axes and polylines do not need a chart library).
const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

const PALETTE = ["#2257a8", "#c0392b", "#1e7b34", "#8e44ad", "#d35400", "#16a085", "#7f8c8d", "#b7950b"];

function ticks(low, high, count = 5) {
  if (high === low) return [low];
  const step = Math.pow(10, Math.floor(Math.log10((high - low) / count)));
  const nice = [1, 2, 5, 10].map((m) => m * step).find((s) => (high - low) / s <= count) || step * 10;
  const out = [];
  for (let v = Math.ceil(low / nice) * nice; v <= high + 1e-9; v += nice) out.push(Number(v.toPrecision(12)));
  return out;
}

// series: [{ name, points: [[x, y], ...], color?, dashed?, dots? }]
export function lineChart(series, { width = 640, height = 260, yMin, yMax, xLabel = "", yLabel = "", title = "" } = {}) {
  // the legend runs left to right above the plot (wrapping), so that no line crosses it
  const legend = series.filter((s) => !s.hideLegend);
  const legendTop = (title ? 22 : 8) + 4;
  const placed = [];
  let at = { x: 46, row: 0 };
  for (const s of legend) {
    const w = 24 + 6.5 * s.name.length; // about the width of the 11 px label
    if (at.x + w > width - 12 && at.x > 46) at = { x: 46, row: at.row + 1 };
    placed.push({ s, x: at.x, y: legendTop + at.row * 14 });
    at.x += w;
  }
  const legendRows = legend.length ? at.row + 1 : 0;
  const pad = { left: 46, right: 12, top: legendTop + legendRows * 14 + 14, bottom: 34 };
  const all = series.flatMap((s) => s.points);
  const xs = all.map((p) => p[0]);
  const ys = all.map((p) => p[1]);
  const x0 = xs.length ? Math.min(...xs) : 0;
  const x1 = xs.length ? Math.max(...xs) : 1;
  const y0 = yMin ?? (ys.length ? Math.min(0, ...ys) : 0);
  // a flat series (no calls yet: all zeros) gets a unit range, not an axis up to 1e-9
  const top = ys.length ? Math.max(...ys) : y0 + 1;
  const y1 = yMax ?? (top > y0 ? top : y0 + 1);
  const sx = (x) => pad.left + ((x - x0) / (x1 - x0 || 1)) * (width - pad.left - pad.right);
  const sy = (y) => height - pad.bottom - ((y - y0) / (y1 - y0 || 1)) * (height - pad.top - pad.bottom);
  const root = svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": title || yLabel });
  if (title) root.append(svg("text", { x: pad.left, y: 14, style: "font-weight:600;fill:#1d1f21" }, title));
  for (const t of ticks(y0, y1)) {
    root.append(svg("line", { x1: pad.left, x2: width - pad.right, y1: sy(t), y2: sy(t), stroke: "#eee" }));
    root.append(svg("text", { x: pad.left - 4, y: sy(t) + 4, "text-anchor": "end" }, String(t)));
  }
  for (const t of ticks(x0, x1, 8)) root.append(svg("text", { x: sx(t), y: height - pad.bottom + 14, "text-anchor": "middle" }, String(t)));
  root.append(svg("text", { x: (width + pad.left) / 2, y: height - 4, "text-anchor": "middle" }, xLabel));
  root.append(svg("text", { x: 10, y: pad.top - 6, "text-anchor": "start" }, yLabel));
  series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    const points = s.points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
    const line = svg("polyline", { points, fill: "none", stroke: color, "stroke-width": 2, "data-series": s.name });
    if (s.dashed) line.setAttribute("stroke-dasharray", "5 4");
    if (s.opacity) line.setAttribute("stroke-opacity", s.opacity);
    line.append(svg("title", {}, s.name));
    root.append(line);
    if (s.dots) for (const [x, y] of s.points) root.append(svg("circle", { cx: sx(x), cy: sy(y), r: 3, fill: color }, undefined));
  });
  for (const { s, x, y } of placed) {
    const color = s.color || PALETTE[series.indexOf(s) % PALETTE.length];
    root.append(svg("rect", { x, y: y + 2, width: 10, height: 10, fill: color }));
    root.append(svg("text", { x: x + 14, y: y + 11 }, s.name));
  }
  return root;
}
