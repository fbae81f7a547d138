// The job page: reads /job (and /status for this agent's recent restarts) every few
// seconds, and draws the node table, each node's compute time over time, the restarts
// and rounds on a timeline, and GPU memory where the records carry it. Plain DOM and
// SVG, no library; every text from the agents goes in through textContent.
"use strict";

const EVERY_MS = 2000;
const KEEP = 300; // points per node
const COLORS = ["#0969da", "#1a7f37", "#bf3989", "#8250df", "#bc4c00", "#0550ae",
  "#116329", "#953800", "#6639ba", "#4d2d00"];
const SLOW = 1.5;
const SVG = "http://www.w3.org/2000/svg";

const series = new Map(); // node id -> {host, color, points: [[t, seconds]]}
const events = []; // {at, text}
const seen = { generation: null, restarts: new Map(), recent: new Set() };
const started = Date.now() / 1000;

function el(tag, attrs = {}, text) {
  const node = tag === "svg" || ["polyline", "line", "text", "rect", "circle", "title"]
    .includes(tag) ? document.createElementNS(SVG, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function dash(value, digits) {
  if (value === null || value === undefined) return "-";
  return digits === undefined ? String(value) : Number(value).toFixed(digits);
}

function spans(ranks) {
  const out = [];
  for (const r of ranks) {
    const last = out[out.length - 1];
    if (last && r === last[1] + 1) last[1] = r; else out.push([r, r]);
  }
  return out.map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`)).join(",") || "-";
}

function clock(at) {
  return new Date(at * 1000).toLocaleTimeString();
}

function colorOf(node) {
  if (!series.has(node)) series.set(node, { host: "", color: COLORS[series.size % COLORS.length], points: [] });
  return series.get(node).color;
}

function drawHeader(doc) {
  const store = doc.store || {};
  let where = store.serving || store.where || "-";
  if (store.term !== undefined) where += ` term ${store.term}`;
  if (store.tls) where += " (TLS)";
  document.getElementById("run").textContent = doc.run_id;
  document.getElementById("summary").textContent =
    `round ${doc.generation} · world size ${dash(doc.world_size)} · nodes ${doc.size} ` +
    `(${doc.min_nodes}:${doc.max_nodes}) · spares waiting ${doc.spares} · store ${where}` +
    Object.entries(doc.excluded || {}).map(([n, why]) => ` · ${n} excluded (${why})`).join("");
}

function drawTable(doc) {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const row of doc.nodes) {
    const slow = row.ratio !== null && row.ratio >= SLOW;
    const tr = el("tr", {
      class: slow ? "slow" : row.state === "UNKNOWN" ? "unknown" : "",
      "data-node": row.node || "", "data-host": row.host || "",
    });
    let note = "";
    if (row.last_failure) {
      const f = row.last_failure;
      note = `rank ${f.rank} ${f.signal || `exit ${f.exitcode}`} at ${f.at ? clock(f.at) : "?"}`;
    }
    if (row.drain) note = `draining: ${row.drain}` + (note ? `; ${note}` : "");
    const cells = [
      [row.group_rank, "num"], [row.host || "-"], [row.state], [spans(row.ranks)],
      [dash(row.attempt), "num"],
      [row.restarts === null ? "-" : `${row.restarts}/${row.max_restarts}`, "num"],
      [dash(row.steps), "num"], [dash(row.step_rate, 1), "num"],
      [dash(row.ratio, 2), "num ratio"],
      [row.record_age === null ? "-" : `${Math.round(row.record_age)} s`, "num"], [note],
    ];
    for (const [text, cls] of cells) tr.append(el("td", cls ? { class: cls } : {}, text));
    if (row.node) tr.firstChild.prepend(el("i", { class: "swatch", style: `background:${colorOf(row.node)}` }));
    body.append(tr);
  }
}

function record(doc) {
  for (const row of doc.nodes) {
    if (!row.node || row.at === null) continue;
    const measure = row.compute !== null ? row.compute : row.step_time;
    if (measure === null) continue;
    colorOf(row.node);
    const s = series.get(row.node);
    s.host = row.host || row.node;
    const last = s.points[s.points.length - 1];
    if (!last || last[0] !== row.at) s.points.push([row.at, measure]);
    if (s.points.length > KEEP) s.points.shift();
    const before = seen.restarts.get(row.node);
    if (before !== undefined && row.restarts > before) {
      events.push({ at: row.at, kind: "restart", text: `${s.host}: restart ${row.restarts}` });
    }
    seen.restarts.set(row.node, row.restarts);
  }
  if (seen.generation !== null && doc.generation !== seen.generation) {
    events.push({ at: Date.now() / 1000, kind: "round",
      text: `round ${doc.generation}: ${doc.size} node(s), world size ${dash(doc.world_size)}` });
  }
  seen.generation = doc.generation;
}

function axes(svg, width, height, left, bottom, yMax, unit) {
  svg.append(el("line", { class: "axis", x1: left, y1: height - bottom, x2: width, y2: height - bottom }));
  svg.append(el("line", { class: "axis", x1: left, y1: 0, x2: left, y2: height - bottom }));
  for (const f of [0, 0.5, 1]) {
    const y = (height - bottom) * (1 - f) + (f === 1 ? 10 : 0);
    svg.append(el("text", { x: 4, y }, `${(yMax * f).toPrecision(2)} ${unit}`));
  }
}

function drawSteps() {
  const svg = document.getElementById("steps");
  svg.replaceChildren();
  const [width, height, left, bottom] = [900, 260, 70, 20];
  const all = [...series.values()].flatMap((s) => s.points);
  if (!all.length) {
    svg.append(el("text", { x: left + 10, y: 40 }, "no compute times yet (the workers report them through agentd.heartbeat / agentd.section)"));
    return;
  }
  const t0 = Math.min(...all.map((p) => p[0]));
  const t1 = Math.max(t0 + 10, ...all.map((p) => p[0]));
  const yMax = Math.max(...all.map((p) => p[1])) * 1.15 || 1;
  axes(svg, width, height, left, bottom, yMax, "s");
  svg.append(el("text", { x: left + 4, y: height - 4 }, clock(t0)));
  svg.append(el("text", { x: width - 70, y: height - 4 }, clock(t1)));
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  for (const [node, s] of series) {
    const xy = s.points.map(([t, v]) => [
      left + (width - left - 10) * (t - t0) / (t1 - t0),
      (height - bottom) * (1 - v / yMax),
    ]);
    const line = el("polyline", {
      points: xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" "),
      stroke: s.color, "data-node": node, "data-host": s.host,
      "data-last": s.points.length ? s.points[s.points.length - 1][1] : "",
    });
    line.append(el("title", {}, `${s.host} (${node})`));
    svg.append(line);
    const item = el("span");
    item.append(el("i", { style: `background:${s.color}` }), document.createTextNode(s.host));
    legend.append(item);
  }
}

function drawTimeline() {
  const svg = document.getElementById("timeline");
  svg.replaceChildren();
  const [width, left] = [900, 10];
  const now = Date.now() / 1000;
  const t0 = Math.min(started, ...events.map((e) => e.at));
  svg.append(el("line", { class: "axis", x1: left, y1: 40, x2: width - 10, y2: 40 }));
  svg.append(el("text", { x: left, y: 62 }, clock(t0)));
  svg.append(el("text", { x: width - 80, y: 62 }, clock(now)));
  const list = document.getElementById("events");
  list.replaceChildren();
  for (const e of [...events].sort((a, b) => a.at - b.at)) {
    const x = left + (width - 20 - left) * (e.at - t0) / Math.max(1, now - t0);
    const mark = el("circle", { cx: x.toFixed(1), cy: 40, r: 6,
      fill: e.kind === "round" ? "#0969da" : "#b3261e", "data-kind": e.kind });
    mark.append(el("title", {}, e.text));
    svg.append(mark);
    list.append(el("li", {}, `${clock(e.at)}  ${e.text}`));
  }
  if (!events.length) list.append(el("li", {}, "none since the agent started"));
}

function drawGpus(doc) {
  const rows = doc.nodes.filter((r) => r.gpu_memory_mib !== null && r.gpu_memory_mib !== undefined);
  document.getElementById("gpus").hidden = !rows.length;
  if (!rows.length) return;
  const svg = document.getElementById("gpu");
  svg.replaceChildren();
  const most = Math.max(1, ...rows.map((r) => r.gpu_memory_mib));
  rows.forEach((r, i) => {
    const y = 10 + i * (140 / rows.length);
    const w = 600 * r.gpu_memory_mib / most;
    svg.append(el("text", { x: 4, y: y + 12 }, r.host || r.node));
    svg.append(el("rect", { x: 160, y, width: w.toFixed(1), height: Math.max(6, 120 / rows.length),
      fill: colorOf(r.node) }));
    svg.append(el("text", { x: 166 + w, y: y + 12 }, `${r.gpu_memory_mib} MiB`));
  });
}

function fromStatus(status) {
  for (const r of status.recent_restarts || []) {
    const key = `${r.at}`;
    if (seen.recent.has(key)) continue;
    seen.recent.add(key);
    const text = r.reason === "membership"
      ? "re-formed for a membership change (no restart spent)"
      : `restart ${r.restart_count}: ${r.cause || r.reason}`;
    events.push({ at: r.at, kind: r.reason === "membership" ? "round" : "restart",
      text: `${status.host}: ${text}` });
  }
}

async function poll() {
  const problem = document.getElementById("problem");
  try {
    // A watcher's header: the agent's exit waits for the page to be shown the end.
    const follow = { "Agentd-Follow": String(EVERY_MS / 1000) };
    const answer = await fetch("job", { cache: "no-store", headers: follow });
    const doc = await answer.json();
    if (!answer.ok) throw new Error(doc.error || `/job answered ${answer.status}`);
    problem.hidden = true;
    if (!doc.ended) {  // an agent whose run ended exits once told so: no more to ask
      fromStatus(await fetch("status", { cache: "no-store" }).then((a) => a.json()));
    }
    record(doc);
    drawHeader(doc);
    drawTable(doc);
    drawSteps();
    drawTimeline();
    drawGpus(doc);
    if (doc.ended) {  // the agent exits: this view is its last
      clearInterval(polling);
      const ended = document.getElementById("ended");
      ended.hidden = false;
      ended.textContent = `The run of this agent ended: ${doc.ended}. ` +
        "The view stays as it was last read.";
    }
  } catch (err) {
    problem.hidden = false;
    problem.textContent = `Cannot read the job: ${err.message}`;
  }
}

document.getElementById("every").textContent = EVERY_MS / 1000;
poll();
const polling = setInterval(poll, EVERY_MS);
