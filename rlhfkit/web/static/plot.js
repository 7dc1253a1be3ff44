// A small SVG line-chart plotter for the run viewer: several series overlaid, nice axis ticks, a hover
// cursor with every series' value. Text goes in with textContent only.
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 360;
  const HEIGHT = 200;
  const PAD = { left: 50, right: 12, top: 8, bottom: 24 };

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (parent) parent.append(node);
    return node;
  }

  // About `count` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten).
  function niceTicks(lo, hi, count) {
    if (lo === hi) {
      const pad = Math.abs(lo) > 0 ? Math.abs(lo) * 0.1 : 1;
      lo -= pad;
      hi += pad;
    }
    const raw = (hi - lo) / Math.max(count, 1);
    const power = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
    const first = Math.floor(lo / step);
    const last = Math.ceil(hi / step);
    const ticks = [];
    for (let i = first; i <= last; i++) ticks.push(Number((i * step).toPrecision(12)) || 0);  // no 6.9e-18 for 0
    return ticks;
  }

  function format(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) return v.toExponential(1).replace("e+", "e");
    return String(Number(v.toPrecision(4)));
  }

  // Exponential moving average with TensorBoard's debiasing, so the first points are not pulled to 0.
  function smooth(points, weight) {
    if (!weight) return points;
    let last = 0;
    let n = 0;
    return points.map(([x, y]) => {
      last = last * weight + (1 - weight) * y;
      n += 1;
      return [x, last / (1 - weight ** n)];
    });
  }

  function nearest(points, x) {
    let lo = 0;
    let hi = points.length - 1;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (points[mid][0] < x) lo = mid;
      else hi = mid;
    }
    return Math.abs(points[lo][0] - x) <= Math.abs(points[hi][0] - x) ? points[lo] : points[hi];
  }

  // series: [{name, color, points: [[x, y], ...]}] (x ascending); options: smoothing, xLabel (the hover's name
  // for x: "step"). Returns the chart's <svg>.
  function lineChart(container, series, options) {
    const opts = Object.assign({ smoothing: 0, xLabel: "step" }, options);
    const shown = series.filter((s) => s.points.length > 0);
    const svg = el("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img" });
    container.append(svg);
    if (!shown.length) return svg;
    const xs = shown.flatMap((s) => s.points.map((p) => p[0]));
    const ys = shown.flatMap((s) => s.points.map((p) => p[1]));
    // x spans the steps logged, ticks at round steps inside; y is widened to round ticks
    let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
    if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
    const xTicks = niceTicks(x0, x1, 5).filter((t) => t >= x0 - 1e-9 && t <= x1 + 1e-9);
    const yTicks = niceTicks(Math.min(...ys), Math.max(...ys), 4);
    const [y0, y1] = [yTicks[0], yTicks[yTicks.length - 1]];
    const px = (x) => PAD.left + ((x - x0) / (x1 - x0 || 1)) * (WIDTH - PAD.left - PAD.right);
    const py = (y) => HEIGHT - PAD.bottom - ((y - y0) / (y1 - y0 || 1)) * (HEIGHT - PAD.top - PAD.bottom);

    for (const t of yTicks) {
      el("line", { class: "grid", x1: PAD.left, x2: WIDTH - PAD.right, y1: py(t), y2: py(t) }, svg);
      el("text", { class: "tick", x: PAD.left - 6, y: py(t) + 3, "text-anchor": "end" }, svg).textContent = format(t);
    }
    for (const t of xTicks) {
      el("text", { class: "tick", x: px(t), y: HEIGHT - 8, "text-anchor": "middle" }, svg).textContent = format(t);
    }
    el("line", { class: "axis", x1: PAD.left, x2: WIDTH - PAD.right, y1: HEIGHT - PAD.bottom, y2: HEIGHT - PAD.bottom }, svg);
    el("line", { class: "axis", x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: HEIGHT - PAD.bottom }, svg);

    const path = (points) => points.map(([x, y], i) => `${i ? "L" : "M"}${px(x).toFixed(1)},${py(y).toFixed(1)}`).join("");
    const drawn = shown.map((s) => ({ ...s, drawn: smooth(s.points, opts.smoothing) }));
    for (const s of drawn) {
      if (opts.smoothing) el("path", { class: "raw", d: path(s.points), stroke: s.color }, svg);
      if (s.points.length === 1) {
        el("circle", { class: "dot", cx: px(s.drawn[0][0]), cy: py(s.drawn[0][1]), r: 3.5, fill: s.color }, svg);
      } else {
        el("path", { class: "line", d: path(s.drawn), stroke: s.color, "data-run": s.name }, svg);
      }
    }

    // Hover: a cursor at the nearest step, a dot on each series, their values in a tooltip.
    const cursor = el("line", { class: "cursor", y1: PAD.top, y2: HEIGHT - PAD.bottom, visibility: "hidden" }, svg);
    const dots = drawn.map((s) => el("circle", { class: "dot", r: 3.5, fill: s.color, visibility: "hidden" }, svg));
    const steps = [...new Set(xs)].sort((a, b) => a - b).map((v) => [v]);
    const tip = document.createElement("div");
    tip.className = "tooltip";
    tip.hidden = true;
    container.append(tip);
    const overlay = el("rect", { x: PAD.left, y: PAD.top, width: WIDTH - PAD.left - PAD.right, height: HEIGHT - PAD.top - PAD.bottom, fill: "transparent" }, svg);
    overlay.addEventListener("mousemove", (event) => {
      const box = svg.getBoundingClientRect();
      const x = x0 + ((event.clientX - box.left) * (WIDTH / box.width) - PAD.left) / (WIDTH - PAD.left - PAD.right) * (x1 - x0);
      const at = nearest(steps, x)[0];
      cursor.setAttribute("x1", px(at));
      cursor.setAttribute("x2", px(at));
      cursor.setAttribute("visibility", "visible");
      tip.replaceChildren();
      const head = document.createElement("div");
      head.textContent = `${opts.xLabel} ${format(at)}`;
      tip.append(head);
      drawn.forEach((s, i) => {
        const p = nearest(s.drawn, at);
        dots[i].setAttribute("cx", px(p[0]));
        dots[i].setAttribute("cy", py(p[1]));
        dots[i].setAttribute("visibility", "visible");
        const row = document.createElement("div");
        const swatch = document.createElement("span");
        swatch.className = "swatch";
        swatch.style.background = s.color;
        const text = document.createElement("span");
        text.textContent = `${s.name}: ${format(p[1])}`;
        row.append(swatch, text);
        tip.append(row);
      });
      tip.hidden = false;
      const left = (px(at) / WIDTH) * box.width;
      tip.style.left = `${Math.min(left + 14, box.width - tip.offsetWidth)}px`;
      tip.style.top = "30px";
    });
    overlay.addEventListener("mouseleave", () => {
      cursor.setAttribute("visibility", "hidden");
      dots.forEach((d) => d.setAttribute("visibility", "hidden"));
      tip.hidden = true;
    });
    return svg;
  }

  window.rlhfkitPlot = { lineChart, niceTicks, smooth, format };
})();
