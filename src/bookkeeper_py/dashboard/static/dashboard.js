// The dashboard's page: polls the JSON API of the server that served it and draws what it says.
// Plain DOM (text set with textContent, never parsed as HTML) and inline SVG charts; nothing is
// loaded from anywhere else.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const OVERVIEW_MS = 1000;
const LEDGERS_MS = 2000;
const SLOW_MS = 5000;
const PAGE = 25;

const state = {
  actionsEnabled: false,
  bookies: [],
  ledgerQuery: "",
  ledgerAfter: -1,
  ledgerNext: null,
  ledgerPages: [],
  ledger: null, // the ledger id shown in the ledger section
  bookie: null, // the bookie id shown in the bookie section
  logAfter: "",
  logNext: null,
  logPages: [],
};

function $(id) {
  return document.getElementById(id);
}

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function bytes(count) {
  if (count === null || count === undefined) return "?";
  const units = ["B", "KB", "MB", "GB", "TB", "PB"];
  let value = count;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return (unit === 0 ? value : value.toFixed(1)) + " " + units[unit];
}

function number(value, digits) {
  if (value === null || value === undefined) return "–";
  return Number(value).toFixed(digits);
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "?";
  if (seconds < 60) return Math.round(seconds) + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.round(seconds % 60) + " s";
  return Math.floor(seconds / 3600) + " h " + Math.round((seconds % 3600) / 60) + " min";
}

function when(ms) {
  if (!ms) return "never";
  return new Date(ms).toLocaleTimeString();
}

async function api(path, options) {
  const answer = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
  const text = await answer.text();
  if (!answer.ok) {
    const error = new Error(text.split("\n")[0] || answer.statusText);
    error.status = answer.status;
    throw error;
  }
  return text ? JSON.parse(text) : null;
}

function say(message, kind) {
  const box = $("alert");
  box.textContent = message;
  box.className = kind || "info";
  box.hidden = false;
}

// Repeats `work` every `ms` milliseconds, never two at once.
function every(ms, work) {
  const run = async () => {
    try {
      await work();
    } catch (error) {
      $("updated").textContent = "cannot reach the dashboard: " + error.message;
    }
    setTimeout(run, ms);
  };
  run();
}

// Redraws `body` with `rows`, giving the focus back to the same control of the same row (the
// tables are redrawn every poll; a keyboard user must not lose their place).
function redraw(body, rows, key) {
  const active = document.activeElement;
  let where = null;
  if (active && body.contains(active)) {
    const row = active.closest("tr");
    where = row ? [row.getAttribute(key), active.tagName, active.className] : null;
  }
  body.replaceChildren(...rows);
  if (!where) return;
  for (const row of body.rows) {
    if (row.getAttribute(key) !== where[0]) continue;
    const again = [...row.querySelectorAll(where[1])].find((n) => n.className === where[2]);
    if (again) again.focus();
  }
}

// -- confirmation and actions -------------------------------------------------------------------

function confirmThen(text, act) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  dialog.returnValue = "";
  dialog.addEventListener(
    "close",
    () => {
      if (dialog.returnValue === "ok") act();
    },
    { once: true }
  );
  dialog.showModal();
  $("confirm-cancel").focus();
}

async function action(path, body, done) {
  try {
    const answer = await api(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(Object.assign({ confirm: true }, body || {})),
    });
    say("Done: " + JSON.stringify(answer), "info");
    if (done) done();
  } catch (error) {
    const refused = error.status === 403 ? "Refused" : "Failed";
    say(refused + " (" + (error.status || "network") + "): " + error.message, "error");
  }
}

// -- bookies --------------------------------------------------------------------------------------

function disksCell(bookie) {
  if (!bookie.disks.length) return el("td", {}, bookie.state === "down" ? "–" : "?");
  const list = el("ul", { class: "disks" });
  for (const disk of bookie.disks) {
    const total = disk.totalSpace || 0;
    const used = total && disk.freeSpace !== null ? total - disk.freeSpace : null;
    const share = used !== null && total ? Math.round((100 * used) / total) : null;
    list.append(
      el(
        "li",
        { title: disk.path },
        el("span", { class: "kind" }, disk.kind + " "),
        el("meter", { min: 0, max: 100, value: share === null ? 0 : share, "aria-label": disk.kind + " disk used" }),
        " " + (share === null ? "?" : share + "% of " + bytes(total))
      )
    );
  }
  return el("td", {}, list);
}

function bookieActions(bookie) {
  const id = bookie.id;
  const readOnly = bookie.state === "read-only";
  const label = readOnly ? "Set writable" : "Set read-only";
  return el(
    "td",
    { class: "actions" },
    el(
      "button",
      {
        type: "button",
        class: "set-readonly",
        onclick: () =>
          confirmThen(label + ": bookie " + id + "?", () =>
            action("/api/bookies/" + encodeURIComponent(id) + "/readonly", { readOnly: !readOnly })
          ),
      },
      label
    ),
    " ",
    el(
      "button",
      {
        type: "button",
        class: "trigger-gc",
        onclick: () =>
          confirmThen("Run garbage collection now on bookie " + id + "?", () =>
            action("/api/bookies/" + encodeURIComponent(id) + "/gc")
          ),
      },
      "Run GC"
    )
  );
}

function drawBookies(bookies) {
  const body = $("bookie-table").tBodies[0];
  redraw(
    body,
    bookies.map((bookie) => {
      const latest = bookie.latest || {};
      const live = bookie.state !== "down";
      return el(
        "tr",
        { "data-bookie-id": bookie.id, "data-state": bookie.state },
        el(
          "th",
          { scope: "row" },
          el("a", { href: "#bookie/" + encodeURIComponent(bookie.id), class: "bookie-link" }, bookie.id),
          el("div", { class: "sub rack" }, "rack " + (bookie.rack || "default")),
          bookie.http ? el("div", { class: "sub" }, bookie.http) : null
        ),
        el(
          "td",
          {},
          el("span", { class: "state state-" + bookie.state }, bookie.state),
          bookie.reason ? el("div", { class: "sub" }, bookie.reason) : null
        ),
        disksCell(bookie),
        el("td", { class: "num" }, live ? number(latest.adds, 1) : "–"),
        el("td", { class: "num" }, live ? number(latest.reads, 1) : "–"),
        el("td", { class: "num" }, live ? number(latest.addP99Ms, 2) : "–"),
        el("td", { class: "num" }, live ? number(latest.readP99Ms, 2) : "–"),
        el("td", { class: "num" }, live ? number(latest.journalSyncP99Ms, 2) : "–"),
        el(
          "td",
          { class: "num", title: bookie.lastCheckpointAt ? "at " + when(bookie.lastCheckpointAt) : "none seen yet" },
          number(bookie.lastCheckpointMs, 1)
        ),
        bookieActions(bookie)
      );
    }),
    "data-bookie-id"
  );
}

function drawGc(bookies) {
  const body = $("gc-table").tBodies[0];
  const rows = [];
  for (const bookie of bookies) {
    for (const status of bookie.gc || []) {
      const now = [];
      if (status.majorCompacting) now.push("major");
      if (status.minorCompacting) now.push("minor");
      if (status.forceCompacting) now.push("forced");
      rows.push(
        el(
          "tr",
          {},
          el("th", { scope: "row" }, bookie.id),
          el("td", {}, now.length ? now.join(", ") : "no"),
          el("td", { class: "num" }, status.majorCompactionCounter),
          el("td", { class: "num" }, status.minorCompactionCounter),
          el("td", {}, when(status.lastMajorCompactionTime)),
          el("td", {}, when(status.lastMinorCompactionTime))
        )
      );
    }
  }
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 6 }, "no GC reported yet")));
  body.replaceChildren(...rows);
}

// -- charts ---------------------------------------------------------------------------------------

// A line chart of `series` ({name, cls, values: [[t, v|null]...]}) over the last points.
function lineChart(node, series, unit) {
  const width = 600;
  const height = 200;
  const left = 48;
  const bottom = 22;
  const top = 10;
  const right = 10;
  const all = series.flatMap((s) => s.values.filter((p) => p[1] !== null));
  const times = series.flatMap((s) => s.values.map((p) => p[0]));
  node.replaceChildren();
  node.append(svg("title", {}, node.previousElementSibling ? node.previousElementSibling.textContent : ""));
  if (!times.length) {
    node.append(svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "empty" }, "no data yet"));
    node.setAttribute("aria-label", "no data yet");
    return;
  }
  const t0 = Math.min(...times);
  const t1 = Math.max(...times, t0 + 1000);
  const highest = Math.max(0, ...all.map((p) => p[1]));
  const top_value = (highest > 0 ? highest : 1) * 1.1; // an idle chart still has a scale
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (width - left - right);
  const y = (v) => height - bottom - (v / top_value) * (height - bottom - top);
  node.append(svg("line", { x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, class: "axis" }));
  node.append(svg("line", { x1: left, y1: top, x2: left, y2: height - bottom, class: "axis" }));
  for (const share of [0.5, 1]) {
    const v = (top_value / 1.1) * share;
    node.append(svg("line", { x1: left, y1: y(v), x2: width - right, y2: y(v), class: "grid" }));
    node.append(svg("text", { x: left - 4, y: y(v) + 4, "text-anchor": "end", class: "label" }, v >= 100 ? v.toFixed(0) : v.toFixed(2)));
  }
  node.append(svg("text", { x: left, y: height - 6, class: "label" }, new Date(t0).toLocaleTimeString()));
  node.append(svg("text", { x: width - right, y: height - 6, "text-anchor": "end", class: "label" }, new Date(t1).toLocaleTimeString()));
  const described = [];
  series.forEach((s, index) => {
    const points = s.values.filter((p) => p[1] !== null);
    if (!points.length) return;
    node.append(svg("polyline", { class: "line " + s.cls, points: points.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ") }));
    const group = svg("g", { class: "points " + s.cls });
    for (const p of points) group.append(svg("circle", { class: "point", cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: 1.6 }));
    node.append(group);
    node.append(svg("text", { x: left + 8 + index * 110, y: top + 12, class: "legend " + s.cls }, s.name));
    const last = points[points.length - 1][1];
    described.push(s.name + " now " + last.toFixed(2) + (unit ? " " + unit : ""));
  });
  node.setAttribute("aria-label", described.join("; ") || "no data yet");
}

function drawCharts(points, rateNode, latencyNode) {
  lineChart(rateNode || $("chart-rate"), [
    { name: "adds/s", cls: "adds", values: points.map((p) => [p.t, p.adds]) },
    { name: "reads/s", cls: "reads", values: points.map((p) => [p.t, p.reads]) },
  ]);
  lineChart(
    latencyNode || $("chart-latency"),
    [
      { name: "p99 add", cls: "latency", values: points.map((p) => [p.t, p.addP99Ms]) },
      { name: "p99 journal sync", cls: "journal", values: points.map((p) => [p.t, p.journalSyncP99Ms]) },
    ],
    "ms"
  );
}

// The bookie section (#bookie/ID): its own charts, from its points of the last minutes.
async function showBookie(id, focus) {
  state.bookie = id;
  $("bookie").hidden = false;
  $("bookie-title").textContent = "Bookie " + id;
  let found;
  try {
    found = await api("/api/bookies/" + encodeURIComponent(id));
  } catch (error) {
    $("bookie-facts").replaceChildren(el("dt", {}, "Error"), el("dd", {}, error.message));
    if (focus) $("bookie-title").focus();
    return;
  }
  const facts = [
    ["State", found.state + (found.reason ? " (" + found.reason + ")" : "")],
    ["Rack", found.rack || "default"],
    ["HTTP endpoint", found.http || "none registered"],
    ["Last answer", when(found.lastAnswerMs)],
    ["Last checkpoint (ledger storage)", found.lastCheckpointMs === null ? "none seen yet" : number(found.lastCheckpointMs, 1) + " ms at " + when(found.lastCheckpointAt)],
  ];
  $("bookie-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))]));
  drawCharts(found.history, $("bookie-chart-rate"), $("bookie-chart-latency"));
  if (focus) $("bookie-title").focus();
}

async function pollOverview() {
  const overview = await api("/api/overview");
  state.actionsEnabled = overview.actionsEnabled;
  state.bookies = overview.bookies;
  $("root").textContent = "metadata root " + overview.metadataRoot;
  const mode = $("mode");
  mode.textContent = overview.actionsEnabled ? "actions enabled" : "read-only: actions are refused";
  mode.className = "badge " + (overview.actionsEnabled ? "warn" : "quiet");
  const c = overview.cluster;
  $("cluster-counts").textContent =
    c.bookies + " bookies: " + c.readWrite + " read-write, " + c.readOnly + " read-only, " + c.down + " down";
  $("updated").textContent = overview.error
    ? "poll failed: " + overview.error
    : "updated " + when(overview.updatedMs) + (overview.racksError ? " · racks: " + overview.racksError : "");
  drawBookies(overview.bookies);
  drawGc(overview.bookies);
  drawCharts(overview.chart);
}

// -- ledgers --------------------------------------------------------------------------------------

function ensemblesText(ledger) {
  return ledger.ensembles.map((e) => "from " + e.firstEntryId + ": " + e.bookies.join(", ")).join("; ");
}

async function pollLedgers() {
  const query = new URLSearchParams({ after: String(state.ledgerAfter), limit: String(PAGE) });
  if (state.ledgerQuery) query.set("q", state.ledgerQuery);
  const page = await api("/api/ledgers?" + query);
  state.ledgerNext = page.next;
  const body = $("ledger-table").tBodies[0];
  const rows = page.ledgers.map((ledger) =>
    el(
      "tr",
      { "data-ledger-id": ledger.id },
      el("th", { scope: "row" }, el("a", { href: "#ledger/" + ledger.id }, String(ledger.id))),
      el("td", {}, ledger.state),
      el("td", { class: "num" }, bytes(ledger.length)),
      el("td", { class: "num" }, ledger.lastEntryId),
      el("td", {}, ledger.ensembleSize + "/" + ledger.writeQuorumSize + "/" + ledger.ackQuorumSize),
      el("td", { class: "ensembles" }, ensemblesText(ledger))
    )
  );
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 6 }, state.ledgerQuery ? "no ledger id contains " + state.ledgerQuery : "no ledgers")));
  redraw(body, rows, "data-ledger-id");
  $("ledger-next").disabled = page.next === null;
  $("ledger-first").disabled = state.ledgerAfter < 0;
  $("ledger-page-info").textContent = "page " + (state.ledgerPages.length + 1);
}

async function showLedger(id, focus) {
  state.ledger = id;
  const section = $("ledger");
  section.hidden = false;
  let ledger;
  try {
    ledger = await api("/api/ledgers/" + id);
  } catch (error) {
    $("ledger-title").textContent = "Ledger " + id;
    $("ledger-facts").replaceChildren(el("dt", {}, "Error"), el("dd", {}, error.message));
    $("fragment-table").tHead.replaceChildren();
    $("fragment-table").tBodies[0].replaceChildren();
    if (focus) $("ledger-title").focus();
    return;
  }
  $("ledger-title").textContent = "Ledger " + ledger.id;
  const facts = [
    ["State", ledger.state],
    ["Size", bytes(ledger.length)],
    ["Last entry", ledger.lastEntryId],
    ["Ensemble / write quorum / ack quorum", ledger.ensembleSize + " / " + ledger.writeQuorumSize + " / " + ledger.ackQuorumSize],
    ["Digest", ledger.digestType || "not kept (legacy)"],
    ["Created", ledger.ctime ? new Date(ledger.ctime).toLocaleString() : "?"],
  ];
  $("ledger-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))]));
  const table = $("fragment-table");
  table.tHead.replaceChildren(
    el("tr", {}, el("th", { scope: "col" }, "Entries"), ...ledger.fragmentBookies.map((b) => el("th", { scope: "col" }, b)))
  );
  table.tBodies[0].replaceChildren(
    ...ledger.fragments.map((f) =>
      el(
        "tr",
        {},
        el("th", { scope: "row" }, f.firstEntryId + " – " + (f.lastEntryId === null ? "…" : f.lastEntryId)),
        ...f.cells.map((cell) =>
          el("td", { class: cell === null ? "out" : "in" }, cell === null ? "–" : "#" + cell)
        )
      )
    )
  );
  if (focus) $("ledger-title").focus();
}

async function readEntries(event) {
  event.preventDefault();
  const first = $("entry-first").value;
  const last = $("entry-last").value;
  const box = $("entries");
  box.replaceChildren(el("p", {}, "reading…"));
  try {
    const found = await api("/api/ledgers/" + state.ledger + "/entries?" + new URLSearchParams({ first, last }));
    if (!found.entries.length) {
      box.replaceChildren(el("p", {}, "no confirmed entry in that range"));
      return;
    }
    box.replaceChildren(
      el(
        "table",
        { class: "entries" },
        el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Entry"), el("th", { scope: "col" }, "Bytes"), el("th", { scope: "col" }, "Payload"))),
        el(
          "tbody",
          {},
          ...found.entries.map((e) =>
            el("tr", {}, el("th", { scope: "row" }, e.id), el("td", { class: "num" }, e.size), el("td", {}, el("pre", {}, e.text + (e.truncated ? " …" : ""))))
          )
        )
      )
    );
  } catch (error) {
    box.replaceChildren(el("p", { class: "error" }, "Cannot read: " + error.message));
  }
}

// -- recovery and logs ----------------------------------------------------------------------------

async function pollRecovery() {
  const found = await api("/api/recovery");
  const parts = [
    "AutoRecovery " + (found.autorecoveryEnabled ? "enabled" : "disabled"),
    found.auditor ? "auditor " + found.auditor : "no auditor running",
    found.count + " ledgers under-replicated",
    found.beingReplicated + " being re-replicated now",
  ];
  if (found.peak > 0) parts.push(found.replicatedSincePeak + " of " + found.peak + " re-replicated since the peak this page saw");
  if (found.ledgersPerS > 0) {
    parts.push("pace " + number(found.ledgersPerS, 2) + " ledgers/s, " + bytes(found.bytesPerS) + "/s over the last minute");
  }
  if (found.etaS !== null) parts.push("done in about " + duration(found.etaS));
  $("recovery-summary").textContent = parts.join(" · ");
  const rows = found.underReplicated.map((u) =>
    el("tr", {}, el("th", { scope: "row" }, el("a", { href: "#ledger/" + u.ledger }, String(u.ledger))), el("td", {}, u.missing.join(", ")), el("td", {}, u.worker || "waiting"), el("td", {}, when(u.markedMs)))
  );
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 4 }, "none")));
  $("recovery-table").tBodies[0].replaceChildren(...rows);
}

async function pollLogs() {
  const query = new URLSearchParams({ limit: String(PAGE) });
  if (state.logAfter) query.set("after", state.logAfter);
  const found = await api("/api/logs?" + query);
  state.logNext = found.next;
  const rows = found.logs.map((log) => {
    if (log.error) return el("tr", {}, el("th", { scope: "row" }, log.namespace + "/" + log.name), el("td", { colspan: 5 }, log.error));
    const open = log.segments.filter((s) => s.state === "open");
    const writer = open.length ? open.map((s) => s.writer_id).join(", ") : "none";
    const subs = log.subscriptions.map((s) => s.name + " (" + s.lag + ")").join(", ") || "none";
    return el(
      "tr",
      {},
      el("th", { scope: "row" }, log.namespace + "/" + log.name),
      el("td", { class: "num" }, log.segments.length),
      el("td", {}, writer),
      el("td", { class: "num" }, log.record_count),
      el("td", { class: "num" }, bytes(log.byte_count)),
      el("td", {}, subs)
    );
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 6 }, "no logs")));
  $("log-table").tBodies[0].replaceChildren(...rows);
  $("log-next").disabled = found.next === null;
  $("log-first").disabled = !state.logAfter;
  $("log-page-info").textContent = "page " + (state.logPages.length + 1);
}

// -- wiring ---------------------------------------------------------------------------------------

function route() {
  const match = /^#ledger\/(\d+)$/.exec(location.hash);
  if (match) {
    showLedger(match[1], true);
  } else {
    state.ledger = null;
    $("ledger").hidden = true;
  }
  const bookie = /^#bookie\/(.+)$/.exec(location.hash);
  if (bookie) {
    showBookie(decodeURIComponent(bookie[1]), true);
  } else {
    state.bookie = null;
    $("bookie").hidden = true;
  }
}

function start() {
  $("ledger-search").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("ledger-query").value.trim();
    if (text && !/^\d+$/.test(text)) {
      say("Search by ledger id: digits only", "error");
      return;
    }
    state.ledgerQuery = text;
    state.ledgerAfter = -1;
    state.ledgerPages = [];
    pollLedgers();
  });
  $("ledger-clear").addEventListener("click", () => {
    $("ledger-query").value = "";
    state.ledgerQuery = "";
    state.ledgerAfter = -1;
    state.ledgerPages = [];
    pollLedgers();
  });
  $("ledger-next").addEventListener("click", () => {
    if (state.ledgerNext === null) return;
    state.ledgerPages.push(state.ledgerAfter);
    state.ledgerAfter = state.ledgerNext;
    pollLedgers();
  });
  $("ledger-first").addEventListener("click", () => {
    state.ledgerAfter = -1;
    state.ledgerPages = [];
    pollLedgers();
  });
  $("log-next").addEventListener("click", () => {
    if (state.logNext === null) return;
    state.logPages.push(state.logAfter);
    state.logAfter = state.logNext;
    pollLogs();
  });
  $("log-first").addEventListener("click", () => {
    state.logAfter = "";
    state.logPages = [];
    pollLogs();
  });
  $("entry-form").addEventListener("submit", readEntries);
  $("ledger-delete").addEventListener("click", () => {
    const id = state.ledger;
    confirmThen("Delete ledger " + id + "? Its entries are lost for good.", () =>
      action("/api/ledgers/" + id + "/delete", {}, () => {
        location.hash = "#ledgers";
      })
    );
  });
  window.addEventListener("hashchange", route);
  route();
  every(OVERVIEW_MS, async () => {
    await pollOverview();
    if (state.bookie !== null) await showBookie(state.bookie, false);
  });
  every(LEDGERS_MS, async () => {
    await pollLedgers();
    if (state.ledger !== null) await showLedger(state.ledger, false);
  });
  every(SLOW_MS, pollRecovery);
  every(SLOW_MS, pollLogs);
}

document.addEventListener("DOMContentLoaded", start);
