// The fleet dashboard: polls /api/fleet and redraws. Plain DOM and SVG, no dependencies.
"use strict";

const POLL_MS = 1500;
const STATES = ["online", "offline", "imputed", "dropped", "late"];
const COLOURS = { online: "#2e7d32", offline: "#9e9e9e", imputed: "#1565c0", dropped: "#c62828", late: "#ef6c00" };
const SVG_NS = "http://www.w3.org/2000/svg";
const token = new URLSearchParams(window.location.search).get("token");

const $ = (id) => document.getElementById(id);

function svgElement(name, attributes, text) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  if (text !== undefined) element.textContent = text;
  return element;
}

function cell(row, text, field) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (field) td.dataset.field = field;
  return td;
}

function ago(unix) {
  if (!unix) return "–";
  const seconds = Math.round(Date.now() / 1000 - unix);
  if (Math.abs(seconds) < 120) return seconds >= 0 ? `${seconds} s ago` : `in ${-seconds} s`;
  const minutes = Math.round(seconds / 60);
  return minutes >= 0 ? `${minutes} min ago` : `in ${-minutes} min`;
}

function humanBytes(n) {
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function showRound(view) {
  const round = view.round;
  $("fleet").textContent = view.fleet;
  $("campaign").textContent = view.campaign;
  const panel = $("round-panel");
  if (!round) { $("round-state").textContent = "not started"; return; }
  const online = view.clients.filter((c) => c.online).map((c) => c.client);
  const waiting = round.open ? online.filter((c) => !round.reported.includes(c)) : [];
  $("round-number").textContent = round.round;
  $("round-of").textContent = `of ${view.total_rounds}`;
  $("round-state").textContent = round.finished ? "finished" : round.open ? "open" : "closed";
  const deadline = new Date(round.deadline * 1000).toLocaleTimeString();
  $("round-deadline").textContent = round.open ? `${deadline} (${ago(round.deadline)})` : "–";
  $("round-reported").textContent = `${round.reported.length} / ${online.length} online`;
  const more = waiting.length > 20 ? ` … (+${waiting.length - 20})` : "";
  $("round-waiting").textContent = waiting.length ? waiting.slice(0, 20).join(", ") + more : "nobody";
  panel.dataset.round = round.round;
  panel.dataset.open = round.open;
}

function showStations(clients) {
  const svg = $("stations");
  svg.replaceChildren();
  const placed = clients.filter((c) => c.latitude !== null && c.longitude !== null);
  $("unplaced").textContent = placed.length < clients.length ? `${clients.length - placed.length} without coordinates` : "";
  if (!placed.length) return;
  const lats = placed.map((c) => c.latitude), lons = placed.map((c) => c.longitude);
  const [south, north, west, east] = [Math.min(...lats), Math.max(...lats), Math.min(...lons), Math.max(...lons)];
  const squeeze = Math.cos(((south + north) / 2) * Math.PI / 180);  // equirectangular: degrees of longitude shrink
  const spanX = Math.max((east - west) * squeeze, 0.01), spanY = Math.max(north - south, 0.01);
  const scale = Math.min(380 / spanX, 220 / spanY);
  const x = (lon) => 210 + ((lon - (west + east) / 2) * squeeze) * scale;
  const y = (lat) => 130 - (lat - (south + north) / 2) * scale;
  svg.append(svgElement("text", { x: 4, y: 12 }, `${north.toFixed(2)}°N`), svgElement("text", { x: 4, y: 255 }, `${south.toFixed(2)}°`),
             svgElement("text", { x: 330, y: 255 }, `${west.toFixed(2)}..${east.toFixed(2)}°E`));
  const radius = placed.length > 200 ? 2.5 : 6;
  for (const client of placed) {
    const dot = svgElement("circle", { cx: x(client.longitude).toFixed(1), cy: y(client.latitude).toFixed(1), r: radius,
                                       fill: COLOURS[client.state] || "#000" });
    dot.dataset.client = client.client;
    dot.dataset.state = client.state;
    if (client.reported) dot.classList.add("reported");
    dot.append(svgElement("title", {}, `${client.client}: ${client.state}${client.reported ? ", reported this round" : ""}`));
    svg.append(dot);
  }
}

function showLegend(clients) {
  const legend = $("legend");
  legend.replaceChildren();
  for (const state of STATES) {
    const item = document.createElement("li"), swatch = document.createElement("span");
    swatch.className = `state-${state}`;
    item.append(swatch, `${state} ${clients.filter((c) => c.state === state).length}`);
    item.dataset.state = state;
    legend.append(item);
  }
  const ring = document.createElement("li");
  ring.textContent = "black ring: reported this round";
  legend.append(ring);
}

function showClients(clients) {
  const body = document.createElement("tbody");
  for (const client of clients) {
    const row = body.insertRow();
    row.dataset.client = client.client;
    row.dataset.state = client.state;
    row.dataset.reported = client.reported ? "yes" : "no";
    cell(row, client.client, "client");
    const state = cell(row, client.state, "state"), badge = document.createElement("span");
    badge.className = `badge state-${client.state}`;
    state.prepend(badge);
    cell(row, client.reported ? "reported" : "not reported", "reported");
    cell(row, client.features, "features");
    cell(row, client.samples, "samples");
    cell(row, client.last_round, "last_round");
    cell(row, ago(client.last_seen), "last_seen");
    cell(row, client.serves, "serves");
    cell(row, fixed(client.served_mase), "served_mase");
    cell(row, client.best_anchor === null ? null : `${client.best_anchor} (${fixed(client.anchor_mase)})`, "best_anchor");
    const ratio = client.served_mase !== null && client.anchor_mase ? client.served_mase / client.anchor_mase - 1 : null;
    cell(row, ratio === null ? null : `${ratio > 0 ? "+" : ""}${(100 * ratio).toFixed(1)}%`, "vs_anchor");
    cell(row, client.latitude === null ? null : `${client.latitude.toFixed(3)}, ${client.longitude.toFixed(3)}`, "position");
  }
  $("clients").tBodies[0].replaceWith(body);
  $("client-count").textContent = clients.length;
}

function showCounts(table, counts, key) {
  const body = document.createElement("tbody");
  for (const [name, count] of Object.entries(counts).slice(0, 50)) {
    const row = body.insertRow();
    row.dataset[key] = name;
    cell(row, name, key);
    cell(row, count, "count");
  }
  $(table).tBodies[0].replaceWith(body);
}

function axes(svg, rounds, maximum, label, minimum = 0) {
  svg.append(svgElement("line", { x1: 40, y1: 180, x2: 410, y2: 180, class: "axis" }),
             svgElement("line", { x1: 40, y1: 10, x2: 40, y2: 180, class: "axis" }),
             svgElement("text", { x: 2, y: 16 }, label(maximum)), svgElement("text", { x: 2, y: 180 }, label(minimum)),
             svgElement("text", { x: 40, y: 196 }, `round ${rounds[0].round}`),
             svgElement("text", { x: 350, y: 196 }, `round ${rounds[rounds.length - 1].round}`));
}

function showLoss(rounds) {
  const svg = $("loss");
  svg.replaceChildren();
  const points = rounds.filter((r) => r.loss !== null);
  if (!points.length) return;
  const top = Math.max(...points.map((r) => r.loss)) || 1;
  const step = 370 / Math.max(points.length - 1, 1);
  axes(svg, points, top, (v) => v.toPrecision(3));
  const coords = points.map((r, i) => `${(40 + i * step).toFixed(1)},${(180 - (r.loss / top) * 165).toFixed(1)}`);
  const curve = svgElement("polyline", { points: coords.join(" "), class: "curve" });
  curve.dataset.rounds = points.length;
  svg.append(curve);
}

const QUALITY = ["served", "federated", "anchor"];  // each round's fleet-mean validation MASE

function showQuality(rounds) {
  const svg = $("quality");
  svg.replaceChildren();
  const points = rounds.filter((r) => r.validation && QUALITY.some((k) => r.validation[k] !== null));
  if (!points.length) return;
  const values = points.flatMap((r) => QUALITY.map((k) => r.validation[k])).filter((v) => v !== null);
  const spread = Math.max(...values) - Math.min(...values) || 0.01;  // the curves' differences fill the height
  const low = Math.max(Math.min(...values) - 0.1 * spread, 0), top = Math.max(...values) + 0.1 * spread;
  const step = 370 / Math.max(points.length - 1, 1);
  axes(svg, points, top, (v) => v.toPrecision(3), low);
  for (const key of QUALITY) {
    const coords = points.map((r, i) => [i, r.validation[key]]).filter(([, v]) => v !== null)
      .map(([i, v]) => `${(40 + i * step).toFixed(1)},${(180 - ((v - low) / (top - low)) * 165).toFixed(1)}`);
    const curve = svgElement("polyline", { points: coords.join(" "), class: `curve ${key}` });
    curve.dataset.rounds = coords.length;
    curve.append(svgElement("title", {}, `${key}: ${fixed(points[points.length - 1].validation[key])} in round ${points[points.length - 1].round}`));
    svg.append(curve);
  }
}

function fixed(value) {
  return value === null || value === undefined ? null : value.toFixed(3);
}

function showBytes(rounds, current) {
  const svg = $("bytes");
  svg.replaceChildren();
  const bars = current && current.open ? [...rounds, { round: current.round, update_bytes: current.update_bytes }] : rounds;
  if (!bars.length) return;
  const top = Math.max(...bars.map((r) => r.update_bytes)) || 1;
  const width = 370 / bars.length;
  axes(svg, bars, top, humanBytes);
  bars.forEach((r, i) => {
    const height = (r.update_bytes / top) * 165;
    const bar = svgElement("rect", { x: (40 + i * width + 1).toFixed(1), y: (180 - height).toFixed(1),
                                     width: Math.max(width - 2, 1).toFixed(1), height: height.toFixed(1), class: "bar" });
    bar.append(svgElement("title", {}, `round ${r.round}: ${humanBytes(r.update_bytes)}`));
    svg.append(bar);
  });
}

function show(view) {
  const started = performance.now();
  showRound(view);
  showStations(view.clients);
  showLegend(view.clients);
  showClients(view.clients);
  showLoss(view.rounds);
  showQuality(view.rounds);
  showBytes(view.rounds, view.round);
  $("rejections-total").textContent = view.rejections.total;
  showCounts("rejections-by-code", view.rejections.by_code, "code");
  showCounts("rejections-by-client", view.rejections.by_client, "client");
  $("updated").textContent = new Date(view.generated_at * 1000).toLocaleTimeString();
  document.body.dataset.renderMs = (performance.now() - started).toFixed(1);
  document.body.dataset.loaded = "yes";
}

async function poll() {
  try {
    const response = await fetch("/api/fleet", { headers: token ? { Authorization: `Bearer ${token}` } : {}, cache: "no-store" });
    if (!response.ok) throw new Error(`${response.status} ${(await response.json()).error}`);
    show(await response.json());
    $("error").hidden = true;
  } catch (error) {
    $("error").textContent = `cannot read the fleet: ${error.message}`;
    $("error").hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

poll();
