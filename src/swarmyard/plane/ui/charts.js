// swarmyard's charts, hand-made SVG (no library): spend and holds against the ceiling, best score over time,
// calls in flight. Drawn from a run's series (swarmyard.report.series) by the dashboard and by report.html, which
// embeds this file. Every chart keeps the figures it drew in data-points (JSON), as the store gave them.
"use strict";

const SwarmCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 600, H = 190, L = 70, R = 14, T = 12, B = 28;

  function node(tag, attrs, text) {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    if (text !== undefined) n.textContent = text;
    return n;
  }

  // an integer scale's top: a multiple of 4, so that its four ticks are whole numbers
  function whole(v) { return Math.max(4, Math.ceil(v / 4) * 4); }

  function usd(micro) { return "$" + (micro / 1e6).toFixed(micro >= 1e5 ? 2 : 6); }

  // a chart's frame: axes, the x ticks in seconds, y labels from fmt, and x(t), y(v) for its marks
  function frame(name, title, end, top, fmt) {
    const svg = node("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart chart-" + name, role: "img", "aria-label": title });
    const x = (t) => L + (W - L - R) * Math.max(0, t) / Math.max(end, 1e-9);
    const y = (v) => H - B - (H - T - B) * v / Math.max(top, 1e-9);
    svg.append(node("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis-line" }),
      node("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis-line" }));
    for (let i = 0; i <= 4; i += 1) {
      const t = end * i / 4, v = top * i / 4;
      svg.append(node("text", { x: x(t), y: H - 10, class: "axis", "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" }, t.toFixed(t < 10 ? 1 : 0) + " s"),
        node("text", { x: L - 4, y: y(v) + 4, class: "axis", "text-anchor": "end" }, fmt(v)));
    }
    return { svg, x, y };
  }

  // a step line through [t, v] points from 0 (value 0) to end
  function steps(points, end, x, y, cls) {
    const xy = [[x(0), y(0)]];
    for (const [t, v] of points) xy.push([x(t), xy[xy.length - 1][1]], [x(t), y(v)]);
    xy.push([x(end), xy[xy.length - 1][1]]);
    return node("polyline", { points: xy.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" "), class: cls });
  }

  function legend(items) {
    const div = document.createElement("div");
    div.className = "legend";
    for (const [cls, label] of items) {
      const key = document.createElement("span");
      key.className = "key " + cls;
      const item = document.createElement("span");
      item.append(key, document.createTextNode(label));
      div.append(item);
    }
    return div;
  }

  function figure(name, title, svg, keys, points) {
    const fig = document.createElement("figure");
    fig.className = "chart-figure";
    fig.id = "chart-" + name;
    fig.dataset.points = JSON.stringify(points);
    const cap = document.createElement("figcaption");
    cap.textContent = title;
    fig.append(cap, svg, legend(keys));
    return fig;
  }

  function spend(s, end) {
    const top = Math.max(s.ceiling, 1, ...s.spend.map((p) => p[1] + p[2]));
    const { svg, x, y } = frame("spend", "Spend and holds against the ceiling", end, top, usd);
    svg.append(node("line", { x1: L, x2: W - R, y1: y(s.ceiling), y2: y(s.ceiling), class: "ceiling" }),
      steps(s.spend.map(([t, settled, held]) => [t, settled + held]), end, x, y, "line held"),
      steps(s.spend.map(([t, settled]) => [t, settled]), end, x, y, "line settled"));
    const last = s.spend.length ? s.spend[s.spend.length - 1] : [0, 0, 0];
    const share = s.ceiling > 0 ? " (" + (100 * (last[1] + last[2]) / s.ceiling).toFixed(1) + "%)" : "";
    return figure("spend", "Spend and holds against the ceiling: " + usd(last[1]) + " settled + " + usd(last[2]) +
      " held of " + usd(s.ceiling) + share, svg,
      [["settled", "settled spend"], ["held", "settled + held (calls not yet answered, or unknown)"], ["ceiling", "ceiling"]], s.spend);
  }

  function best(s, end) {
    const top = whole(Math.max(1, ...s.best.map((p) => p[1])));
    const { svg, x, y } = frame("best", "Best score over time", end, top, (v) => String(Math.round(v)));
    if (s.best.length) svg.append(steps(s.best.map(([t, v]) => [t, v]), end, x, y, "line best"));
    for (const [t, v, who] of s.best) {
      const dot = node("circle", { cx: x(t), cy: y(v), r: 4, class: "dot best", "data-t": t, "data-score": v });
      dot.append(node("title", {}, who + ": " + v + " at " + t.toFixed(1) + " s"));
      svg.append(dot);
    }
    if (!s.best.length) svg.append(node("text", { x: W / 2, y: H / 2, class: "axis", "text-anchor": "middle" }, "no score yet"));
    const source = s.score_source === "findings" ? "scores carried by findings"
      : s.score_source === "evaluator" ? "the evaluator's search scores" : "none yet";
    return figure("best", "Best score over time", svg, [["best", "best so far (" + source + ")"]], s.best);
  }

  function flight(s, end) {
    const lanes = s.open_calls.length;
    const top = whole(Math.max(1, ...s.in_flight.map((p) => p[1])));
    const { svg, x, y } = frame("flight", "Calls in flight", end, top, (v) => String(Math.round(v)));
    svg.append(steps(s.in_flight, end, x, y, "line flight"));
    const list = document.createElement("ul");
    list.className = "open-calls";
    for (const c of s.open_calls) {
      const li = document.createElement("li");
      li.dataset.start = String(c.start);
      li.textContent = c.worker + " · " + c.model + " · waiting " + Math.max(0, end - c.start).toFixed(1) + " s";
      list.append(li);
    }
    const fig = figure("flight", "Calls in flight" + (lanes ? " (" + lanes + " waiting now)" : ""), svg,
      [["flight", "calls reserved and not yet answered"]], s.in_flight);
    if (lanes) fig.append(list);
    return fig;
  }

  // draw every chart of `series` into `container`; `now` (seconds since the goal began) bounds a live run's
  function draw(container, series, now) {
    const end = Math.max(1, series.end !== null && series.end !== undefined ? series.end : now);
    container.replaceChildren(spend(series, end), best(series, end), flight(series, end));
  }

  return { draw };
})();

// report.html: the series is in the page itself
document.addEventListener("DOMContentLoaded", () => {
  const data = document.getElementById("series-data"), box = document.getElementById("run-charts");
  if (data && box) SwarmCharts.draw(box, JSON.parse(data.textContent), 0);
});
