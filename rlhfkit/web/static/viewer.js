// The run viewer: every metric of every run as a curve (runs overlaid), and the samples by step.
// Run names, prompts, responses and conversation turns go in with textContent only.
"use strict";

(() => {
  const COLORS = ["#2f6fdb", "#e0663c", "#2a9d6f", "#9b59b6", "#d4a106", "#1aa3b8", "#c2407a", "#6b7a8f", "#7cb342", "#8d6e63"];
  const byId = (id) => document.getElementById(id);
  const hiddenRuns = new Set();
  let metricRuns = [];
  let sampleRuns = null;

  const make = (tag, className, text) => {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  };

  async function getJson(path) {
    const response = await fetch(path, { cache: "no-store" });
    if (!response.ok) throw new Error(`${path}: ${response.status}`);
    return response.json();
  }

  // Metric names in reading order: those without a prefix ("loss"), then by prefix, the usual RLHF ones first.
  const FIRST = ["", "reward", "kl", "eval", "rewards", "loss", "policy", "value", "response", "rollout"];
  function metricNames(runs) {
    const names = new Set();
    for (const run of runs) for (const row of run.rows) for (const key of Object.keys(row)) if (key !== "step") names.add(key);
    const rank = (name) => {
      const group = name.includes("/") ? name.split("/")[0] : "";
      const i = FIRST.indexOf(group);
      return [i < 0 ? FIRST.length : i, group, name];
    };
    return [...names].sort((a, b) => {
      const [ra, rb] = [rank(a), rank(b)];
      return ra[0] - rb[0] || ra[1].localeCompare(rb[1]) || ra[2].localeCompare(rb[2]);
    });
  }

  function renderLegend() {
    const legend = byId("legend");
    legend.replaceChildren();
    metricRuns.forEach((run, i) => {
      const item = make("span", `legend-item${hiddenRuns.has(run.name) ? " off" : ""}`);
      item.title = `${run.path} (click to hide or show)`;
      const swatch = make("span", "swatch");
      swatch.style.background = COLORS[i % COLORS.length];
      item.append(swatch, make("span", "", run.name));
      item.addEventListener("click", () => {
        if (hiddenRuns.has(run.name)) hiddenRuns.delete(run.name);
        else hiddenRuns.add(run.name);
        renderLegend();
        renderCharts();
      });
      legend.append(item);
    });
  }

  function renderCharts() {
    const charts = byId("charts");
    charts.replaceChildren();
    const filter = byId("filter").value.trim().toLowerCase();
    const smoothing = Number(byId("smoothing").value);
    // x: the step, or the KL to the reference (a reward against KL is the over-optimisation curve)
    const xKey = byId("x-axis").value;
    const all = metricNames(metricRuns);
    byId("no-metrics").hidden = all.length > 0;
    for (const name of all.filter((n) => n.toLowerCase().includes(filter))) {
      const card = make("div", "chart");
      card.dataset.metric = name;
      card.append(make("h3", "", name));
      const series = metricRuns
        .map((run, i) => ({
          name: run.name,
          color: COLORS[i % COLORS.length],
          points: run.rows
            .filter((r) => typeof r[name] === "number" && typeof r[xKey] === "number")
            .map((r) => [r[xKey], r[name]])
            .sort((a, b) => a[0] - b[0]),
        }))
        .filter((s) => !hiddenRuns.has(s.name));
      charts.append(card);
      window.rlhfkitPlot.lineChart(card, series, { smoothing, xLabel: xKey === "step" ? "step" : "KL" });
    }
  }

  async function loadMetrics() {
    metricRuns = (await getJson("/api/metrics")).runs;
    renderLegend();
    renderCharts();
  }

  // A conversation's turns after the prompt (rows of multi-turn runs), each labelled with who spoke; "kind"
  // is one of runs.py's conversation_turns kinds.
  const TURN_LABELS = {
    reply: ["assistant", ""],
    "tool call": ["assistant", "tool call"],
    "tool result": ["tool result", ""],
    "tool error": ["tool result", "error"],
    environment: ["environment", ""],
    system: ["system", ""],
  };
  function conversation(turns) {
    const box = make("div", "conversation");
    for (const turn of turns) {
      const [label, badge] = TURN_LABELS[turn.kind] ?? [turn.role || "?", ""];
      const item = make("div", "turn");
      item.dataset.kind = turn.kind;
      const head = make("div", "turn-head");
      head.append(make("span", "turn-role", label));
      if (badge) head.append(make("span", `badge${turn.kind === "tool error" ? " error" : ""}`, badge));
      item.append(head, make("div", "turn-text", turn.content));
      box.append(item);
    }
    return box;
  }

  function renderSamples() {
    const runSelect = byId("sample-run");
    const stepSelect = byId("sample-step");
    const list = byId("sample-list");
    list.replaceChildren();
    const run = sampleRuns.find((r) => r.name === runSelect.value);
    if (!run) return;
    const step = Number(stepSelect.value);
    const rows = run.rows.filter((r) => r.step === step);
    byId("sample-count").textContent = `${rows.length} sample${rows.length === 1 ? "" : "s"} at step ${step}`;
    for (const row of rows.slice(0, 200)) {
      const card = make("div", "sample");
      const meta = Object.entries(row)
        .filter(([k, v]) => !["prompt", "response", "step"].includes(k) && (typeof v === "number" || typeof v === "string"))
        .map(([k, v]) => `${k} ${typeof v === "number" ? window.rlhfkitPlot.format(v) : v}`)
        .join(" · ");
      card.append(make("div", "meta", meta || `step ${row.step}`));
      const show = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 1));
      card.append(make("div", "sample-prompt", show(row.prompt ?? "")));
      if (Array.isArray(row.turns)) card.append(conversation(row.turns));
      else card.append(make("div", "sample-response", show(row.response ?? "")));
      list.append(card);
    }
  }

  function fillSteps() {
    const run = sampleRuns.find((r) => r.name === byId("sample-run").value);
    const stepSelect = byId("sample-step");
    stepSelect.replaceChildren();
    const steps = run ? [...new Set(run.rows.map((r) => r.step))].sort((a, b) => a - b) : [];
    for (const step of steps) stepSelect.append(new Option(String(step), String(step)));
    if (steps.length) stepSelect.value = String(steps[steps.length - 1]);
    renderSamples();
  }

  async function loadSamples() {
    const keep = byId("sample-run").value;
    sampleRuns = (await getJson("/api/samples")).runs.filter((r) => r.rows.length > 0);
    byId("no-samples").hidden = sampleRuns.length > 0;
    const runSelect = byId("sample-run");
    runSelect.replaceChildren();
    for (const run of sampleRuns) runSelect.append(new Option(run.name, run.name));
    if (sampleRuns.some((r) => r.name === keep)) runSelect.value = keep;
    fillSteps();
  }

  function showTab(name) {
    for (const tab of document.querySelectorAll(".tab")) tab.setAttribute("aria-selected", String(tab.dataset.tab === name));
    for (const panel of document.querySelectorAll(".panel")) panel.hidden = panel.dataset.panel !== name;
    if (name === "samples" && sampleRuns === null) loadSamples();
    if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
  }

  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showTab(tab.dataset.tab));
  byId("filter").addEventListener("input", renderCharts);
  byId("x-axis").addEventListener("change", renderCharts);
  byId("smoothing").addEventListener("input", () => {
    byId("smoothing-value").textContent = byId("smoothing").value;
    renderCharts();
  });
  byId("sample-run").addEventListener("change", fillSteps);
  byId("sample-step").addEventListener("change", renderSamples);
  byId("reload").addEventListener("click", () => {
    loadMetrics();
    if (sampleRuns !== null) loadSamples();
  });
  showTab(["curves", "samples", "report"].includes(location.hash.slice(1)) ? location.hash.slice(1) : "curves");
  loadMetrics();
})();
