// The inspector page: plain ES module, no build step, no third-party code.
// Session content is untrusted: every piece of it goes into the DOM as text
// (textContent via h()), never as HTML.

const $main = document.getElementById("main");
const $counts = document.getElementById("counts");
const $live = document.getElementById("live");
const $banner = document.getElementById("banner");

// ------------------------------------------------------------------ helpers

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function api(path, options = {}) {
  const res = await fetch(path, options);
  const body = await res.json().catch(() => ({ error: res.statusText }));
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function jsonBlock(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

function when(ms) {
  if (!ms) return "–";
  const d = new Date(ms);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

function showError(err) {
  $banner.hidden = !err;
  $banner.textContent = err ? String(err.message || err) : "";
}

// ------------------------------------------------------------------ messages

function blockView(block) {
  if (!block || typeof block !== "object") return h("div", { class: "block" }, String(block));
  switch (block.type) {
    case "text":
      return h("div", { class: "text" }, block.text ?? "");
    case "tool-call":
      return h("div", { class: "block" }, `→ tool call ${block.name} (${block.id}) `,
        JSON.stringify(block.arguments ?? {}));
    case "tool-result": {
      const text = typeof block.text === "string" ? block.text
        : (block.content || []).map((c) => (c && c.type === "text" ? c.text : `[${c && c.type}]`)).join(" ");
      return h("div", { class: "block" }, `← tool result${block.toolCallId ? ` (${block.toolCallId})` : ""} `, text);
    }
    case "tool-addition":
      return h("div", { class: "block" }, `+ tool ${block.toolName}`);
    case "tool-removal":
      return h("div", { class: "block" }, `− tool ${block.toolName}`);
    case "image-ref":
      return h("div", { class: "block offloaded", "data-offloaded": "" },
        h("span", { class: "badge offload" }, "image offloaded"), ` → ${block.uri}`,
        block.mediaType ? ` (${block.mediaType})` : "");
    case "image":  // the runtime's image/offload marks the block, the bytes leave the prompt
      return block.offloaded === true
        ? h("div", { class: "block offloaded", "data-offloaded": "" },
          h("span", { class: "badge offload" }, "image offloaded"),
          block.mediaType ? ` (${block.mediaType})` : "")
        : h("div", { class: "block" }, "[inline image]");
    default:
      return h("div", { class: "block" }, `[${block.type}] `, JSON.stringify(block).slice(0, 300));
  }
}

function messageView(message, meta = [], extraClass = "") {
  const role = (message && message.role) || "?";
  const content = (message && message.content) || [];
  return h("div", { class: `msg ${role} ${extraClass}` },
    h("div", { class: "meta" }, h("b", {}, role), ...meta,
      message && message.toolCallId ? h("span", {}, `for ${message.toolCallId}`) : null,
      message && message.isError ? h("span", { class: "diff-removed" }, "error") : null),
    content.map(blockView));
}

// ------------------------------------------------------------------ live updates

let stream = null;
let onChange = () => {};

function listen(session) {
  if (stream) stream.close();
  const url = "api/stream" + (session ? `?session=${encodeURIComponent(session)}` : "");
  stream = new EventSource(url);
  stream.onopen = () => { $live.className = "live on"; $live.textContent = "live"; };
  stream.onerror = () => { $live.className = "live off"; $live.textContent = "reconnecting"; };
  stream.onmessage = (ev) => {
    const notice = JSON.parse(ev.data);
    onChange(notice);
  };
}

async function refreshHealth() {
  try {
    const hl = await api("api/health");
    $counts.textContent = `${hl.sessions} sessions · ${hl.quarantined} quarantined · views ${hl.topics.views}` +
      (hl.loaded ? "" : " · loading…");
    showError(hl.error ? `cannot read the topics: ${hl.error}` : null);
    return hl;
  } catch (err) { showError(err); return null; }
}

// ------------------------------------------------------------------ sessions list

const listState = { q: "", status: "", sort: "lastActivity", dir: "desc", offset: 0, limit: 50 };
const COLUMNS = [
  ["id", "session", false], ["status", "status", false], ["asOfSeq", "asOfSeq", true],
  ["lastActivity", "last activity", false], ["bytes", "size", true], ["messages", "messages", true],
  ["turns", "turns", true], ["toolCalls", "tool calls", true], ["deadLetters", "dead letters", true],
];

// renderList calls started; only the newest may draw (answers can arrive out of order)
let listRenders = 0;

function showList() {
  // the toolbar, the table's head and the pager stay across refreshes: typing is never
  // interrupted and a click never lands on a control a refresh has just replaced
  const search = h("input", { id: "search", type: "search", placeholder: "search session id", value: listState.q });
  search.addEventListener("input", () => {
    listState.q = search.value; listState.offset = 0;
    clearTimeout(search._t); search._t = setTimeout(renderList, 250);
  });
  const status = h("select", { id: "status-filter", onchange: (e) => { listState.status = e.target.value; listState.offset = 0; renderList(); } },
    h("option", { value: "" }, "any status"), h("option", { value: "ok" }, "ok"),
    h("option", { value: "quarantined" }, "quarantined"));
  status.value = listState.status;
  const head = h("tr", {}, COLUMNS.map(([key, label, num]) => h("th", {
    class: `sortable ${num ? "num" : ""}`,
    "data-sort": key,
    onclick: () => {
      if (listState.sort === key) listState.dir = listState.dir === "asc" ? "desc" : "asc";
      else { listState.sort = key; listState.dir = key === "id" ? "asc" : "desc"; }
      listState.offset = 0; renderList();
    },
  }, label)));
  const pager = h("div", { class: "pager" },
    h("button", { id: "prev", disabled: true, onclick: () => { listState.offset = Math.max(0, listState.offset - listState.limit); renderList(); } }, "‹ prev"),
    h("span", { id: "range" }),
    h("button", { id: "next", disabled: true, onclick: () => { listState.offset += listState.limit; renderList(); } }, "next ›"));
  $main.replaceChildren(h("div", { class: "toolbar" }, search, status, h("span", { id: "list-note", class: "muted" })),
    h("div", { id: "list-body" }, h("table", { id: "session-list" }, h("thead", {}, head), h("tbody", {})), pager));
  return renderList();
}

async function renderList() {
  const mine = ++listRenders;
  const params = new URLSearchParams(Object.entries(listState).map(([k, v]) => [k, String(v)]));
  let page;
  try { page = await api(`api/sessions?${params}`); } catch (err) { showError(err); return; }
  if (mine !== listRenders) return; // a newer render was asked for meanwhile: its answer draws
  const table = document.getElementById("session-list");
  if (!table) return; // navigated away meanwhile
  for (const th of table.tHead.rows[0].cells) {
    const sorted = listState.sort === th.dataset.sort;
    th.classList.toggle("sorted", sorted);
    th.classList.toggle("asc", sorted && listState.dir === "asc");
  }
  const rows = page.rows.map((r) => h("tr", { class: "row", "data-session": r.id, onclick: () => { location.hash = `#/session/${encodeURIComponent(r.id)}`; } },
    h("td", {}, h("a", { href: `#/session/${encodeURIComponent(r.id)}` }, r.id)),
    h("td", {}, h("span", { class: `badge ${r.status}` }, r.status === "none" ? "no views" : r.status), r.reason ? h("div", { class: "muted" }, r.reason) : null),
    h("td", { class: "num" }, r.asOfSeq), h("td", {}, when(r.lastActivity)),
    h("td", { class: "num" }, bytes(r.bytes)), h("td", { class: "num" }, r.messages),
    h("td", { class: "num" }, r.turns), h("td", { class: "num" }, r.toolCalls),
    h("td", { class: "num" }, r.deadLetters)));
  const first = page.total ? listState.offset + 1 : 0;
  const last = Math.min(listState.offset + listState.limit, page.total);
  table.tBodies[0].replaceChildren(...rows);
  document.getElementById("range").textContent = `${first}–${last} of ${page.total}`;
  document.getElementById("prev").disabled = listState.offset === 0;
  document.getElementById("next").disabled = last >= page.total;
  document.getElementById("list-note").textContent = page.loaded ? "" : "loading the views topic…";
}

// ------------------------------------------------------------------ one session

let current = null; // {id, data}

function transcriptCard(d) {
  const entries = d.transcript.map((e) => {
    const el = messageView(e.message, [h("span", {}, `seq ${e.seq}`)]);
    el.classList.add("entry");
    el.dataset.seq = e.seq;
    return el;
  });
  return h("div", { class: "card", id: "transcript" },
    h("h2", {}, "Transcript ", h("span", { class: "muted" }, `${d.transcript.length} entries — what a person saw`)),
    d.transcriptError ? h("div", { class: "diff-removed" }, d.transcriptError) : null,
    h("div", { class: "scroll" }, entries));
}

function surfaceNodes(detail) {
  return detail.nodes.map((n) => {
    const meta = [h("span", {}, `seq ${n.seq}`), h("span", { class: "badge kind" }, n.type)];
    if (n.replace) meta.push(h("span", { class: "badge replace" }, `replaces ${n.replace.startSeq}…${n.replace.endSeq} (${n.replace.shadowed.length} nodes)`));
    if (n.projected) meta.push(h("span", { class: "badge offload" }, "image offloaded"));
    if (!n.message || !(n.message.content || []).length) meta.push(h("span", { class: "muted" }, "empty: keeps its node, sends no message"));
    const el = messageView(n.message, meta, `${n.replace ? "replaced" : ""} ${n.projected ? "projected" : ""}`);
    el.classList.add("node");
    el.dataset.seq = n.seq;
    if (n.replace) {
      const rep = detail.replacements.find((r) => r.seq === n.seq);
      if (rep) {
        el.append(h("details", { class: "shadowed" }, h("summary", {}, `shadowed seqs ${rep.shadowed.join(", ")}`),
          rep.shadowedMessages.map((s) => h("div", {}, `seq ${s.seq} ${s.type || ""} ${s.role || ""}: ${s.preview}`))));
      }
    }
    return el;
  });
}

function surfaceCard(d, detail) {
  const gens = d.surface ? `replaceGeneration ${d.surface.replaceGeneration} · contentGeneration ${d.surface.contentGeneration}` : "";
  const body = detail
    ? (detail.error ? h("div", { class: "diff-removed" }, detail.error) : h("div", { class: "scroll" }, surfaceNodes(detail)))
    : h("p", { class: "muted" }, "folding the session's events…");
  // compare only a fold and a surface view of the same seq (a live update may be in between)
  const folded = detail && !detail.error && detail.asOfSeq === d.summary.asOfSeq
    ? detail.nodes.map((n) => n.seq).join(",") : null;
  const mismatch = folded !== null && d.surface && folded !== d.surface.nodes.join(",")
    ? h("div", { class: "diff-removed", id: "surface-mismatch" }, `the fold of the events topic (nodes ${folded}) differs from the surface view (nodes ${d.surface.nodes.join(",")})`)
    : null;
  const skipped = detail && detail.skipped && detail.skipped.length
    ? h("details", {}, h("summary", {}, `${detail.skipped.length} record(s) not folded`), jsonBlock(detail.skipped)) : null;
  return h("div", { class: "card", id: "surface" },
    h("h2", {}, "Surface ", h("span", { class: "muted" }, `${d.messages.length} messages as the model sees them · ${gens}`)),
    mismatch, skipped, body);
}

function kv(pairs) {
  return h("table", { class: "kv" }, h("tbody", {}, pairs.filter(([, v]) => v !== undefined && v !== null)
    .map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v))))));
}

function headerCard(d) {
  const rh = d.requestHeader;
  const th = d.toolHistory;
  const header = rh && rh.header ? rh.header : null;
  const config = header && header.config ? header.config : {};
  const headerBody = rh === null || rh === undefined ? h("p", { class: "muted" }, "no request/header yet") : h("div", {},
    kv([["seq", rh.seq], ["reason", rh.reason], ...Object.entries(config),
      ["adapterDefaults", header && header.adapterDefaults],
      ["tools", header && Array.isArray(header.tools) ? header.tools.map((t) => t.name).join(", ") : "none"]]),
    h("details", {}, h("summary", {}, "JSON"), jsonBlock(rh)));
  const tools = th && Array.isArray(th.tools) ? th.tools : [];
  const updates = th && Array.isArray(th.updates) ? th.updates : [];
  const historyBody = !th ? h("p", { class: "muted" }, "none") : h("div", {},
    h("div", { class: "muted" }, `baseline: request/header at seq ${th.baselineSeq ?? "–"}`),
    h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "tool"), h("th", {}, "description"))),
      h("tbody", {}, tools.map((t) => h("tr", {}, h("td", {}, t.name), h("td", {}, t.description ?? ""))))),
    updates.length ? h("table", { id: "tool-updates" }, h("thead", {}, h("tr", {}, h("th", {}, "seq"), h("th", {}, "added"), h("th", {}, "removed"))),
      h("tbody", {}, updates.map((u) => h("tr", {}, h("td", {}, u.seq),
        h("td", {}, (u.added || []).map((t) => t.name).join(", ")), h("td", {}, (u.removed || []).join(", ")))))) : null,
    h("details", {}, h("summary", {}, "JSON"), jsonBlock(th)));
  return h("div", { class: "card", id: "request" },
    h("h2", {}, "Request header ", h("span", { class: "muted" }, "the canonical last header")), headerBody,
    h("h2", {}, "Tool history ", h("span", { class: "muted" }, `${tools.length} tools in the baseline · ${updates.length} updates since`)),
    historyBody);
}

function unitsCard(d) {
  return h("div", { class: "card", id: "units" },
    h("h2", {}, "Domain units ", h("span", { class: "muted" }, "every unit observes every event; the view's asOfSeq is when its value last changed")),
    h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "unit"), h("th", { class: "num" }, "observedSeq"), h("th", { class: "num" }, "view asOfSeq"), h("th", { class: "num" }, "stateVersion"), h("th", {}, "view"))),
      h("tbody", {}, d.units.map((u) => h("tr", { "data-unit": u.name },
        h("td", {}, u.name), h("td", { class: "num" }, u.observedSeq), h("td", { class: "num" }, u.asOfSeq),
        h("td", { class: "num" }, u.stateVersion),
        h("td", {}, h("details", {}, h("summary", {}, "value"), jsonBlock(u.value))))))));
}

function quarantineCard(d) {
  if (!d.status || d.status.state !== "quarantined") return null;
  const q = d.status.quarantine || {};
  const token = h("input", { id: "redrive-token", type: "password", placeholder: "redrive token", autocomplete: "off" });
  const result = h("span", { id: "redrive-result", class: "muted" });
  const button = h("button", {
    id: "redrive-button", disabled: !d.redrive,
    onclick: async () => {
      button.disabled = true;
      try {
        await api(`api/session/redrive?id=${encodeURIComponent(current.id)}`, { method: "POST", headers: { "X-Inspector-Token": token.value } });
        result.textContent = "redrive requested; waiting for the processor…";
      } catch (err) { result.textContent = `refused: ${err.message}`; }
      button.disabled = false;
    },
  }, "Redrive");
  return h("div", { class: "card quarantine", id: "quarantine" },
    h("h2", {}, `Quarantined at seq ${q.seq}`),
    h("div", { id: "quarantine-reason" }, `${q.rule}: ${q.reason}`),
    h("div", { class: "muted" }, `events offset ${q.offset}; later events of this session go to the dead-letter topic until a redrive`),
    h("div", { class: "toolbar" }, token, button, result),
    d.redrive ? null : h("div", { class: "muted" }, "redrive is disabled: start the inspector with --token"));
}

function lettersCard(d) {
  return h("div", { class: "card", id: "dead-letters" },
    h("h2", {}, "Dead letters ", h("span", { class: "muted" }, `${d.deadLettersTotal} (newest ${d.deadLetters.length} kept)`)),
    d.deadLetters.length === 0 ? h("p", { class: "muted" }, "none") :
      h("table", {}, h("thead", {}, h("tr", {}, ["rule", "reason", "seq", "partition", "offset", "time", "record"].map((c) => h("th", {}, c)))),
        h("tbody", {}, d.deadLetters.map((l) => h("tr", { class: "letter" },
          h("td", {}, l.rule), h("td", {}, l.reason), h("td", {}, l.seq ?? "–"), h("td", {}, l.partition),
          h("td", {}, l.offset), h("td", {}, when(l.timestamp)),
          h("td", {}, h("details", {}, h("summary", {}, "record"), jsonBlock(l.event ?? l.valueBase64 ?? l.value))))))));
}

function timeTravelCard(d) {
  const max = d.summary.asOfSeq;
  const seq = h("input", { id: "tt-seq", type: "number", min: 0, max, value: current.ttSeq ?? Math.max(0, Math.floor(max / 2)) });
  const slider = h("input", { id: "tt-slider", type: "range", min: 0, max: Math.max(max, 0), value: seq.value });
  slider.addEventListener("input", () => { seq.value = slider.value; });
  seq.addEventListener("input", () => { slider.value = seq.value; });
  const out = h("div", { id: "tt-out" });
  const go = h("button", { id: "tt-go", onclick: () => travel(Number(seq.value), out) }, "Show the session at this seq");
  if (current.ttResult) out.replaceChildren(...current.ttResult);
  return h("div", { class: "card", id: "time-travel" },
    h("h2", {}, "Time travel ", h("span", { class: "muted" }, "an offline fold of the session's events up to a seq, diffed against now")),
    h("div", { class: "toolbar" }, "seq", seq, slider, go), out);
}

async function travel(seq, out) {
  out.replaceChildren(h("p", { class: "muted" }, `folding up to seq ${seq}…`));
  try {
    const t = await api(`api/session/at?id=${encodeURIComponent(current.id)}&seq=${seq}`);
    const diffRows = t.diff.map((c) => h("tr", { class: `diff-${c.kind}` }, h("td", {}, c.kind), h("td", {}, c.path),
      h("td", {}, c.then === undefined ? "" : JSON.stringify(c.then).slice(0, 200)),
      h("td", {}, c.now === undefined ? "" : JSON.stringify(c.now).slice(0, 200))));
    const parts = [
      t.refusedComplete ? null : h("div", { class: "diff-removed" }, "this session has more dead letters than the inspector keeps offsets of: the fold may include records the processor refused"),
      h("div", { id: "tt-surface" },
        h("h2", {}, `Surface at seq ${t.seq} `, h("span", { class: "muted" }, `${t.then.messages.length} messages · replaceGeneration ${t.surface.replaceGeneration} · contentGeneration ${t.surface.contentGeneration}`)),
        h("div", { class: "scroll" }, surfaceNodes(t.surface))),
      h("div", { id: "tt-diff" },
        h("h2", {}, `Changes from seq ${t.seq} to now (seq ${t.nowAsOfSeq}) `, h("span", { class: "muted" }, `${t.diff.length} paths`)),
        h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, ["", "path", "then", "now"].map((c) => h("th", {}, c)))), h("tbody", {}, diffRows)))),
    ];
    current.ttSeq = seq;
    current.ttResult = parts.filter(Boolean);
    out.replaceChildren(...current.ttResult);
  } catch (err) {
    out.replaceChildren(h("p", { class: "diff-removed" }, String(err.message || err)));
  }
}

// A live update redraws the cards: keep what the reader did with them (scroll
// positions, opened details; a list scrolled to its end follows new entries).
function keepViewState() {
  const scrolls = [...document.querySelectorAll(".card")].map((card) => {
    const box = card.querySelector(".scroll");
    return {
      id: card.id,
      top: box ? box.scrollTop : 0,
      atEnd: box ? box.scrollTop + box.clientHeight >= box.scrollHeight - 4 : false,
      open: [...card.querySelectorAll("details")].map((el) => el.open),
    };
  });
  const y = window.scrollY;
  return () => {
    for (const st of scrolls) {
      const card = st.id && document.getElementById(st.id);
      if (!card) continue;
      const box = card.querySelector(".scroll");
      if (box) box.scrollTop = st.atEnd && st.top > 0 ? box.scrollHeight : st.top;
      const details = [...card.querySelectorAll("details")];
      if (details.length === st.open.length) details.forEach((el, i) => { el.open = st.open[i]; });
    }
    window.scrollTo(0, y);
  };
}

async function renderSession(id, { quiet = false } = {}) {
  if (!current || current.id !== id) current = { id };
  let d;
  try { d = await api(`api/session?id=${encodeURIComponent(id)}`); } catch (err) {
    if (!quiet) $main.replaceChildren(h("p", { class: "diff-removed" }, String(err.message || err)), h("a", { href: "#/" }, "back to the sessions"));
    return;
  }
  if (!current || current.id !== id) return;
  current.data = d;
  const s = d.summary;
  const tokenValue = document.getElementById("redrive-token")?.value ?? "";
  const head = h("div", { class: "toolbar", id: "session-head" },
    h("a", { href: "#/" }, "‹ sessions"), h("b", { id: "session-id" }, id),
    h("span", { id: "status-badge", class: `badge ${s.status}` }, s.status),
    h("span", { id: "as-of-seq" }, `asOfSeq ${s.asOfSeq}`),
    h("span", { class: "muted" }, `partition ${s.partition} · ${bytes(s.bytes)} · ${s.turns} turns · ${s.toolCalls} tool calls · last activity ${when(s.lastActivity)}`));
  const surface = surfaceCard(d, current.surface && current.surface.asOfSeq === s.asOfSeq ? current.surface : null);
  const kept = keepViewState();
  $main.replaceChildren(head, quarantineCard(d) || "",
    h("div", { class: "grid" }, transcriptCard(d), surface),
    h("div", { class: "grid" }, headerCard(d), h("div", {}, unitsCard(d), lettersCard(d))),
    timeTravelCard(d));
  const token = document.getElementById("redrive-token");
  if (token) token.value = tokenValue;
  kept();
  if (!current.surface || current.surface.asOfSeq !== s.asOfSeq) {
    try {
      const detail = await api(`api/session/surface?id=${encodeURIComponent(id)}`);
      if (current.id !== id) return;
      current.surface = detail;
    } catch (err) { current.surface = { error: String(err.message || err), asOfSeq: s.asOfSeq, nodes: [] }; }
    const fresh = surfaceCard(current.data, current.surface);
    const keptSurface = keepViewState();
    document.getElementById("surface")?.replaceWith(fresh);
    keptSurface();
  }
}

// ------------------------------------------------------------------ routing

let pending = null;
function debounce(fn) {
  // at most one refresh in flight, the last notice wins
  if (pending) { pending.again = true; return; }
  pending = { again: false };
  Promise.resolve(fn()).finally(() => {
    const again = pending.again; pending = null;
    if (again) debounce(fn);
  });
}

function route() {
  const m = location.hash.match(/^#\/session\/(.+)$/);
  if (m) {
    const id = decodeURIComponent(m[1]);
    current = null;
    $main.replaceChildren(h("p", { class: "muted" }, "loading…"));
    renderSession(id);
    listen(id);
    onChange = () => debounce(() => Promise.all([renderSession(id, { quiet: true }), refreshHealth()]));
  } else {
    current = null;
    showList();
    listen(null);
    onChange = () => debounce(() => Promise.all([renderList(), refreshHealth()]));
  }
}

window.addEventListener("hashchange", route);
refreshHealth();
route();
