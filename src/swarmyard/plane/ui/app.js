// The swarmyard dashboard: one EventSource per goal, every state rendered with textContent (never as HTML).
"use strict";

const $ = (id) => document.getElementById(id);
let source = null;
let lastState = null;
let openWorker = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  return node;
}

function usd(micro) {
  if (micro === null || micro === undefined) return "-";
  return "$" + (micro / 1e6).toFixed(6);
}

function clock(seconds) {
  if (!seconds) return "-";
  return new Date(seconds * 1000).toLocaleTimeString();
}

function bytes(n) {
  if (!n) return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function replaceRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function renderGoal(state) {
  const g = state.goal;
  $("objective").textContent = g.objective;
  $("spend").textContent = usd(g.spent_micro_usd);
  $("holds").textContent = usd(g.held_micro_usd);
  $("ceiling").textContent = usd(g.budget_micro_usd);
  $("calls").textContent = g.calls + " / " + g.call_cap;
  const tokens = state.workers.reduce((sum, w) => sum + (w.input_tokens || 0) + (w.output_tokens || 0), 0);
  $("tokens").textContent = String(tokens);
  $("policy").textContent = g.policy;
  const ceiling = Math.max(1, g.budget_micro_usd);
  $("bar-spent").style.width = Math.min(100, 100 * g.spent_micro_usd / ceiling) + "%";
  $("bar-held").style.width = Math.min(100, 100 * g.held_micro_usd / ceiling) + "%";
}

// workers in slot order (worker-2 before worker-10, the lead last), each slot's runs in the order they began
function bySlot(state) {
  const slots = slotOf(state);
  const order = new Map(state.workers.map((w, i) => [w.id, i]));
  const rank = (w) => (slots.get(w.id) === undefined ? 2 : slots.get(w.id) === "lead" ? 1 : 0);
  return state.workers.slice().sort((a, b) => rank(a) - rank(b) ||
    (slots.get(a.id) || "").localeCompare(slots.get(b.id) || "", undefined, { numeric: true }) ||
    order.get(a.id) - order.get(b.id));
}

function errorCell(error) {
  if (!error) return el("td", {}, "-");
  return el("td", { class: "error", title: error.message }, el("code", {}, error.code), " ", error.message);
}

// what the state column says of a worker
function workerState(w, m) {
  return w.error && m.state !== "running" ? "failed" : m.state || (w.revoked ? "revoked" : "-");
}

// a filter's choices, each with its count (the choice made is kept while states come in)
function renderFilter(select, states) {
  const chosen = select.value || "all";
  const counts = new Map([["all", states.length]]);
  for (const s of states) counts.set(s, (counts.get(s) || 0) + 1);
  const labels = [...counts].map(([name, n]) => [name, name + " (" + n + ")"]);
  const sig = labels.map(([, label]) => label).join("|");
  if (select.dataset.sig !== sig) {  // rebuilt only when a count changed: an open list is left alone otherwise
    select.replaceChildren(...labels.map(([name, label]) => el("option", { value: name }, label)));
    select.dataset.sig = sig;
  }
  select.value = counts.has(chosen) ? chosen : "all";
  return select.value;
}

// each table's sort: a column's key and its direction (1 or -1); none: the table's own order (workers by slot)
const sorts = { workers: null, tasks: null };

function sortRows(table, items, keys) {
  const by = sorts[table];
  if (!by || !keys[by.key]) return items;
  const value = keys[by.key];
  return items.map((item, i) => [item, i]).sort(([a, i], [b, j]) => {
    const va = value(a), vb = value(b);
    const c = typeof va === "number" && typeof vb === "number" ? va - vb
      : String(va ?? "").localeCompare(String(vb ?? ""), undefined, { numeric: true });
    return by.dir * c || i - j;
  }).map(([item]) => item);
}

// the heads show the sort in force (aria-sort), and a click on one sorts by it, then the other way
function sortHeads(table) {
  for (const th of $(table).tHead.querySelectorAll("th[data-sort]")) {
    const by = sorts[table];
    th.setAttribute("aria-sort", by && by.key === th.dataset.sort ? (by.dir > 0 ? "ascending" : "descending") : "none");
  }
}

function onSort(table, render) {
  $(table).tHead.addEventListener("click", (event) => {
    const th = event.target.closest("th[data-sort]");
    if (!th) return;
    const by = sorts[table];
    sorts[table] = by && by.key === th.dataset.sort ? (by.dir > 0 ? { key: by.key, dir: -1 } : null) : { key: th.dataset.sort, dir: 1 };
    if (lastState && !lastState.error) render(lastState);
  });
}

function renderWorkers(state) {
  const machines = new Map(state.machines.map((m) => [m.worker, m]));
  const stateOf = (w) => workerState(w, machines.get(w.id) || {});
  const shown = renderFilter($("worker-filter"), state.workers.map(stateOf));
  const slots = slotOf(state), ordered = bySlot(state), rank = new Map(ordered.map((w, i) => [w.id, i]));
  const listed = sortRows("workers", ordered.filter((w) => shown === "all" || stateOf(w) === shown), {
    slot: (w) => rank.get(w.id), group: (w) => w.group, machine: (w) => (machines.get(w.id) || {}).machine,
    state: stateOf, task: (w) => w.task, calls: (w) => w.calls || 0,
    tokens: (w) => (w.input_tokens || 0) + (w.output_tokens || 0), spend: (w) => w.spent_micro_usd || 0,
    cpu: (w) => w.cpu_ms || 0, memory: (w) => w.max_rss_kb || 0, error: (w) => (w.error ? w.error.code : ""),
  });
  $("workers-count").textContent = "(" + listed.length + " of " + state.workers.length + ")";
  sortHeads("workers");
  const rows = listed.map((w) => {
    const m = machines.get(w.id) || {};
    const row = el("tr", { "data-worker": w.id, "data-slot": slots.get(w.id) || "", class: (w.id === openWorker ? "selected" : "") + (w.error ? " failed" : "") },
      el("td", {}, m.slot ? m.slot + " " : "", el("code", {}, w.id)), el("td", {}, w.group),
      el("td", {}, m.machine || "-"),
      el("td", {}, stateOf(w)),
      el("td", {}, w.task ? w.task + " (" + w.task_state + ")" : "-"), el("td", {}, w.calls || 0),
      el("td", {}, (w.input_tokens || 0) + (w.output_tokens || 0)), el("td", {}, usd(w.spent_micro_usd || 0)),
      el("td", {}, w.cpu_ms ? (w.cpu_ms / 1000).toFixed(1) + " s" : "-"),
      el("td", {}, bytes((w.max_rss_kb || 0) * 1024)), errorCell(w.error));
    row.addEventListener("click", () => showTrajectory(w.id));
    return row;
  });
  replaceRows($("workers").tBodies[0], rows);
}

function renderTasks(state) {
  const shown = renderFilter($("task-filter"), state.tasks.map((t) => t.state));
  const listed = sortRows("tasks", state.tasks.filter((t) => shown === "all" || t.state === shown), {
    title: (t) => t.title, group: (t) => t.group, state: (t) => t.state, worker: (t) => t.worker,
    fencing: (t) => t.fencing_token ?? -1, lease: (t) => t.lease_expires_at || 0, tries: (t) => t.attempts,
    calls: (t) => t.calls, spend: (t) => t.spent_micro_usd, reason: (t) => (t.state === "failed" ? t.result : ""),
  });
  $("tasks-count").textContent = "(" + listed.length + " of " + state.tasks.length + ")";
  sortHeads("tasks");
  replaceRows($("tasks").tBodies[0], listed.map((t) => el("tr", { "data-task": t.id, "data-state": t.state, class: "state-" + t.state },
    el("td", { title: t.result || "" }, t.title), el("td", {}, t.group), el("td", {}, t.state),
    el("td", {}, t.worker || "-"), el("td", {}, t.fencing_token ?? "-"), el("td", {}, clock(t.lease_expires_at)),
    el("td", {}, t.attempts), el("td", {}, t.calls), el("td", {}, usd(t.spent_micro_usd)),
    el("td", { class: t.state === "failed" ? "error" : "" }, t.state === "failed" ? t.result || "(no reason given)" : ""))));
}

// the run's charts (charts.js), to now while it runs
function renderCharts(state) {
  const box = $("charts");
  box.dataset.series = JSON.stringify(state.series);
  SwarmCharts.draw(box, state.series, Date.now() / 1000 - state.goal.created_at);
}

// what went wrong, where the eye lands first: the run's end, failed tasks, errors by code, holds to reconcile
function renderBanner(state) {
  const run = state.run, holds = state.holds, lines = [];
  if (run.finished && run.outcome === "no synthesis") lines.push(el("p", { class: "headline" }, "The run ended without a synthesis."));
  if (run.finished && run.outcome === "stopped") lines.push(el("p", { class: "headline" }, "The run stopped before it closed (interrupted, or it failed)."));
  for (const t of state.tasks.filter((t) => t.state === "failed"))
    lines.push(el("p", { "data-failed-task": t.id }, "Task ", el("b", {}, t.title), " failed after " + t.attempts + " tries: " + (t.result || "(no reason given)")));
  const codes = new Map();
  for (const w of state.workers) if (w.error) codes.set(w.error.code, (codes.get(w.error.code) || 0) + 1);
  if (codes.size)
    lines.push(el("p", { id: "error-codes" }, "Workers' last errors by code: ", ...[...codes].flatMap(([code, n], i) =>
      [i ? ", " : "", el("code", {}, code), " × " + n])));
  if (holds.open) {
    const what = holds.open + " hold" + (holds.open === 1 ? "" : "s") + " (" + usd(holds.open_micro_usd) + ") still open" +
      (holds.unknown ? ", " + holds.unknown + " unknown: the request left and its answer never came, so only the provider's bill says what it cost" : "") + ".";
    lines.push(el("p", { id: "reconcile" }, what + " List them with ", el("code", {}, holds.show),
      ", then settle each with ", el("code", {}, holds.reconcile), "."));
  }
  $("banner").hidden = lines.length === 0;
  $("banner").className = run.finished && run.outcome !== "synthesis" ? "banner failure" : "banner";
  $("banner").replaceChildren(...lines);
}

function renderRun(state) {
  const run = state.run;
  if (!run.finished) return;
  $("live").textContent = "finished · read-only" + (run.outcome ? " · " + run.outcome : "");
  $("live").className = "live finished";
}

function renderBoard(state) {
  const slots = slotOf(state);
  $("board-count").textContent = "(" + state.board_total + ")";
  $("board").replaceChildren(...state.board.slice().reverse().map((p) => el("li", { "data-seq": String(p.seq) },
    el("div", { class: "meta" }, "#" + p.seq + " " + p.kind + " · " + p.group + " · " + who(slots, p.author) + " · " + clock(p.at)),
    el("div", { class: "body" }, p.body))));
}

function renderFindings(state) {
  const slots = slotOf(state);
  $("findings-count").textContent = "(" + state.findings_total + ")";
  $("findings").replaceChildren(...state.findings.slice().reverse().map((f) => el("li", { "data-finding": f.id },
    el("div", { class: "meta" }, f.id + " · " + f.group + " · " + who(slots, f.author) + " · " + f.status +
      (f.score !== null ? " · score " + f.score : "")),
    el("div", { class: "title" }, f.title), el("div", { class: "body" }, f.body),
    el("div", { class: "citations" }, f.citations.length ? "cites: " + f.citations.map((c) => c.kind + " " + c.ref).join(", ") : "no citations"))));
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function slotOf(state) {
  return new Map(state.machines.map((m) => [m.worker, m.slot]));
}

function who(slots, id) {
  return slots.has(id) ? slots.get(id) + " " + id.slice(-6) : id;
}

function renderTimeline(state) {
  const slots = slotOf(state);
  const lanes = bySlot(state).map((w) => w.id);
  const start = state.goal.created_at;
  // a finished run's timeline ends with the run; a live one's now
  const times = state.calls.map((c) => c.end).concat(state.board.map((p) => p.at), state.findings.map((f) => f.at),
    state.run.finished ? [] : [Date.now() / 1000]);
  const end = state.run.finished && state.run.ended_at ? Math.max(start + 1, state.run.ended_at) : Math.max(start + 1, ...times);
  const width = 900, left = 170, lane = 22, height = 30 + lane * Math.max(1, lanes.length);
  const x = (t) => left + (width - left - 10) * (t - start) / (end - start);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "timeline", role: "img" });
  chart.append(svg("text", { x: left, y: 12, class: "axis" }, "0 s"), svg("text", { x: width - 60, y: 12, class: "axis", "data-span": (end - start).toFixed(1) }, (end - start).toFixed(1) + " s"));
  lanes.forEach((id, i) => {
    const y = 20 + i * lane;
    chart.append(svg("text", { x: 4, y: y + 14, class: "lane" }, who(slots, id).slice(0, 24)));
    chart.append(svg("line", { x1: left, x2: width - 10, y1: y + 10, y2: y + 10, class: "lane-line" }));
    for (const c of state.calls.filter((c) => c.worker === id)) {
      // a call still in flight (held, in a live run) runs to now: its bar grows while it waits
      const flying = c.state === "held" && !state.run.finished;
      const stop = flying ? Math.min(end, Date.now() / 1000) : c.end;
      const bar = svg("rect", { x: x(c.start), y: y + 3, width: Math.max(2, x(stop) - x(c.start)), height: 14,
        class: "call call-" + c.state + (flying ? " in-flight" : "") });
      bar.append(svg("title", {}, c.model + " · " + c.tokens + " tokens · " + c.state));
      chart.append(bar);
    }
    for (const p of state.board.filter((p) => p.author === id)) {
      const dot = svg("circle", { cx: x(p.at), cy: y + 10, r: 4, class: "post" });
      dot.append(svg("title", {}, "post #" + p.seq + ": " + p.body.slice(0, 120)));
      chart.append(dot);
    }
    for (const f of state.findings.filter((f) => f.author === id)) {
      const mark = svg("rect", { x: x(f.at) - 4, y: y + 6, width: 8, height: 8, class: "finding" });
      mark.append(svg("title", {}, "finding: " + f.title));
      chart.append(mark);
    }
  });
  $("timeline").replaceChildren(chart);
}

function renderScores(state) {
  $("scores-section").hidden = state.scores.length === 0;
  if (!state.scores.length) return;
  const width = 600, height = 160, start = state.goal.created_at;
  const end = Math.max(start + 1, ...state.scores.map((s) => s.at));
  const top = Math.max(1, ...state.scores.map((s) => s.score));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "scores", role: "img" });
  for (const s of state.scores) {
    const dot = svg("circle", { cx: 30 + (width - 40) * (s.at - start) / (end - start), cy: height - 20 - (height - 40) * s.score / top, r: 4, class: "score" });
    dot.append(svg("title", {}, s.author + ": " + s.score));
    chart.append(dot);
  }
  $("scores").replaceChildren(chart);
}

function render(state) {
  lastState = state;
  if (state.error) { $("live").textContent = state.error.message; return; }
  renderGoal(state);
  renderRun(state);
  renderBanner(state);
  renderWorkers(state);
  renderTasks(state);
  renderTimeline(state);
  renderCharts(state);
  renderScores(state);
  renderBoard(state);
  renderFindings(state);
  if (openWorker) showTrajectory(openWorker, false);
}

async function showTrajectory(workerId, scroll = true) {
  openWorker = workerId;
  const answer = await fetch("/ui/api/trajectory/" + encodeURIComponent(workerId), { credentials: "same-origin" });
  if (!answer.ok) return;
  const data = await answer.json();
  $("trajectory").hidden = false;
  $("trajectory-worker").textContent = workerId;
  const steps = data.steps.filter((s) => !s.cut);
  $("steps").replaceChildren(...(steps.length ? steps.map((s) => {
    const replies = (s.replies || []).map((r) => el("div", { class: "reply" + (r.malformed ? " malformed" : "") },
      el("span", { class: "meta" }, (r.input_tokens + r.output_tokens) + " tokens · " + r.duration_ms + " ms" + (r.malformed ? " · malformed: " + r.malformed : "")),
      el("pre", {}, r.text || (r.tool_calls || []).map((c) => c.name + " " + c.arguments).join("\n"))));
    return el("li", { "data-step": String(s.step) },
      el("div", { class: "meta" }, "step " + s.step + " · " + ((s.ended_ms - s.started_ms) / 1000).toFixed(2) + " s" + (s.note ? " · " + s.note : "")),
      ...replies,
      el("div", { class: "action" }, s.action ? "→ " + s.action.tool + " " + JSON.stringify(s.action.args) : "→ (no action)"),
      el("pre", { class: "result" }, s.result || ""));
  }) : [el("li", {}, data.kept ? "No step reported yet." : "This plane keeps no trajectories.")]));
  if (scroll) $("trajectory").scrollIntoView({ block: "nearest" });
}

// a live run's timeline is drawn again every second, so that calls in flight grow with their elapsed time
setInterval(() => {
  if (lastState && !lastState.error && !lastState.run.finished) { renderTimeline(lastState); renderCharts(lastState); }
}, 1000);

function connect(goalId) {
  if (source) source.close();
  const url = new URL(location.href);
  url.searchParams.set("goal", goalId);
  history.replaceState(null, "", url);
  source = new EventSource("/ui/events?goal=" + encodeURIComponent(goalId));
  source.addEventListener("state", (event) => { $("live").textContent = "live"; $("live").className = "live on"; render(JSON.parse(event.data)); });
  source.addEventListener("error", () => {
    // a finished run's page keeps what it shows; a live one's server may be handing over to the finished view
    if (lastState && lastState.run && lastState.run.finished) { $("live").textContent = "finished · read-only · server stopped"; return; }
    $("live").textContent = "reconnecting"; $("live").className = "live";
  });
}

async function start() {
  const answer = await fetch("/ui/api/goals", { credentials: "same-origin" });
  if (answer.status === 401 || answer.status === 403) { location.reload(); return; }
  const { goals } = await answer.json();
  const select = $("goal-select");
  select.replaceChildren(...goals.slice().reverse().map((g) => el("option", { value: g.id }, g.id + " · " + g.objective.slice(0, 60))));
  const wanted = new URL(location.href).searchParams.get("goal");
  const chosen = goals.find((g) => g.id === wanted) || goals[goals.length - 1];
  if (!chosen) { $("objective").textContent = "No goal yet."; setTimeout(start, 1000); return; }
  select.value = chosen.id;
  select.addEventListener("change", () => connect(select.value));
  $("worker-filter").addEventListener("change", () => { if (lastState && !lastState.error) renderWorkers(lastState); });
  $("task-filter").addEventListener("change", () => { if (lastState && !lastState.error) renderTasks(lastState); });
  onSort("workers", renderWorkers);
  onSort("tasks", renderTasks);
  connect(chosen.id);
}

document.addEventListener("DOMContentLoaded", start);
