/**
 * The rules of docs/views-format.md, one test per rule (named after its id,
 * VF-n, or its section), on records built here as the processor frames them.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { test } from "node:test";

import avro from "avsc";

import { createServer } from "node:http";
import type { AddressInfo } from "node:net";

import { registryLookup, RegistryUnavailable, ViewCodec } from "../src/codec.js";
import { VIEW_SCHEMA, crc64Avro } from "../src/schema.js";
import { assembleTranscript, coreViews, foldEquivalent, unitViews } from "../src/shape.js";
import { ViewsState } from "../src/state.js";
import {
  batch,
  body,
  confluent,
  FINGERPRINT,
  key,
  rec,
  singleObject,
  split,
  tombstone,
  zstdFrame,
  type Rec,
} from "./records.js";

function reader(options: { cacheBytes?: number } = {}): { state: ViewsState; warnings: string[] } {
  const warnings: string[] = [];
  return { state: new ViewsState({ ...options, warn: (line) => warnings.push(line) }), warnings };
}

function feed(state: ViewsState, records: Rec[]): void {
  for (const r of records) state.apply(r.key, r.value);
}

const value = (state: ViewsState, sid: string, name: string): unknown => state.views.get(sid)?.get(name)?.value;

const SCHEMA_FILE = path.resolve(__dirname, "../../../../schemas/view.avsc");

test(
  "§2 single-object: the package's View schema is the repository's (fingerprint, defaults)",
  { skip: existsSync(SCHEMA_FILE) ? false : `no ${SCHEMA_FILE}` },
  () => {
    const file = JSON.parse(readFileSync(SCHEMA_FILE, "utf8")) as { fields: { name: string; default?: unknown }[] };
    const canonical = JSON.stringify(avro.Type.forSchema(file as avro.Schema).schema());
    assert.equal(crc64Avro(canonical).toString("hex"), FINGERPRINT.toString("hex"));
    assert.deepEqual(
      file.fields.map((f) => [f.name, f.default]),
      VIEW_SCHEMA.fields.map((f) => [f.name, (f as { default?: unknown }).default]),
    );
  },
);

test("§2 CRC-64-AVRO: the known fingerprint of the View schema", () => {
  // the value the Python codec computes (processor.codec.schema_fingerprint)
  assert.equal(FINGERPRINT.toString("hex"), "1b92c8588718d49c");
});

test("§2 Confluent framing: the writer schema comes from the registry, resolved to View", async () => {
  // an older writer without part/parts: resolution fills the defaults
  const writer = { ...VIEW_SCHEMA, fields: VIEW_SCHEMA.fields.filter((f) => f.name !== "part" && f.name !== "parts") };
  const type = avro.Type.forSchema(writer as unknown as avro.Schema);
  const b = type.toBuffer({
    sessionId: "s",
    view: "u",
    asOfSeq: 3,
    stateVersion: 2,
    encoding: "JSON",
    value: Buffer.from("[1]"),
  });
  const asked: number[] = [];
  const codec = new ViewCodec(async (id) => {
    asked.push(id);
    return writer;
  });
  const data = confluent(42, b);
  await codec.prepare(data);
  await codec.prepare(data);
  assert.deepEqual(asked, [42]);
  const state = new ViewsState({ codec, warn: assert.fail });
  state.apply(key("s", "u"), data);
  assert.deepEqual(state.views.get("s")?.get("u"), { asOfSeq: 3, stateVersion: 2, value: [1] });
});

test("§2 Confluent framing: registryLookup asks GET <url>/schemas/ids/<id> once per id, retries an unavailable registry", async () => {
  const asked: string[] = [];
  const server = createServer((req, res) => {
    asked.push(req.url ?? "");
    const found = req.url === "/schemas/ids/5";
    if (req.url === "/schemas/ids/7" && asked.filter((u) => u === req.url).length < 3) {
      res.writeHead(503).end(); // unavailable twice: retried, then found
      return;
    }
    res.writeHead(found || req.url === "/schemas/ids/7" ? 200 : 404, { "content-type": "application/json" });
    res.end(
      JSON.stringify(
        found || req.url === "/schemas/ids/7" ? { schema: JSON.stringify(VIEW_SCHEMA) } : { error_code: 40403 },
      ),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
    const warnings: string[] = [];
    const state = new ViewsState({ codec: new ViewCodec(registryLookup(url)), warn: (l) => warnings.push(l) });
    const b = body({ sessionId: "s", view: "u", asOfSeq: 1 }, Buffer.from('"v"'));
    for (const id of [5, 5, 6, 7]) {
      await state.codec.prepare(confluent(id, b));
      state.apply(key("s", "u"), confluent(id, b));
    }
    assert.deepEqual(asked, ["/schemas/ids/5", "/schemas/ids/6", "/schemas/ids/7", "/schemas/ids/7", "/schemas/ids/7"]);
    assert.equal(value(state, "s", "u"), "v");
    assert.deepEqual(warnings, ["views reader: unreadable record: schema id 6: schema registry: id 6: HTTP 404"]);
    server.closeAllConnections();
    const gone = new ViewCodec(registryLookup(url));
    server.close();
    await assert.rejects(gone.prepare(confluent(9, b), 2), RegistryUnavailable);
  } finally {
    server.close();
  }
});

test("§2 a Confluent id without a registry, or of another schema, is a bad record", async () => {
  const codec = new ViewCodec();
  codec.addSchemaId(7, {
    type: "record",
    name: "Other",
    namespace: "processor.v1",
    fields: [{ name: "x", type: "int" }],
  });
  const warnings: string[] = [];
  const state = new ViewsState({ codec, warn: (l) => warnings.push(l) });
  const b = body({ sessionId: "s", view: "u", asOfSeq: 1 }, Buffer.from("1"));
  state.apply(key("s", "u"), confluent(7, b));
  state.apply(key("s", "u"), confluent(8, b));
  assert.equal(state.stats.badRecords, 2);
  assert.match(warnings[0]!, /schema id 7/);
  assert.match(warnings[1]!, /schema id 8: no schema registry configured/);
});

test("§2 unreadable values are skipped and reported, never thrown", () => {
  const { state, warnings } = reader();
  const good = rec({ sessionId: "s", view: "u", asOfSeq: 1 }, { a: 1 }).value!;
  const unknownFp = Buffer.concat([Buffer.from([0xc3, 0x01]), Buffer.alloc(8, 7), good.subarray(10)]);
  const bad = [
    Buffer.from("{}"),
    unknownFp,
    good.subarray(0, good.length - 3),
    Buffer.concat([good, Buffer.from([0])]),
    Buffer.from([0xc3, 0x01, 1]),
  ];
  for (const v of bad) state.apply(key("s", "u"), v);
  assert.equal(state.stats.badRecords, bad.length);
  assert.equal(warnings.length, bad.length);
  assert.match(warnings[0]!, /not a framed Avro record/);
  assert.match(warnings[1]!, /unknown writer schema fingerprint 0707070707070707/);
  assert.equal(state.views.size, 0);
});

test("§2 ZSTD_JSON payloads decode (a zstd frame of JSON text)", () => {
  const { state } = reader();
  feed(state, [rec({ sessionId: "s", view: "u", asOfSeq: 1 }, { big: "x".repeat(5000) }, true)]);
  assert.deepEqual(value(state, "s", "u"), { big: "x".repeat(5000) });
  assert.equal(zstdFrame(Buffer.from("1")).readUInt32LE(0), 0xfd2fb528);
});

test("VF-3 a tombstone maps back through its key, also when ids hold '/'", () => {
  const { state } = reader();
  feed(state, [rec({ sessionId: "a/b", view: "u", asOfSeq: 1 }, 1), rec({ sessionId: "a", view: "u", asOfSeq: 1 }, 2)]);
  feed(state, [tombstone("a/b", "u")]);
  assert.equal(state.views.get("a/b"), undefined);
  assert.equal(value(state, "a", "u"), 2);
});

test("VF-3, VF-4 a tombstone of a gated session's unit is held to its next head, keyed by its last '/'", () => {
  const { state } = reader();
  feed(state, batch("s/1", 1, { bundle: 0, seqs: [0], units: { u: 1 }, nodes: [0], transcript: [0] }));
  feed(state, [tombstone("s/1", "never-seen")]); // held by the session parsed from the key
  assert.equal(state.heldRecords, 1);
  feed(state, [tombstone("s/1", "u")]);
  assert.equal(value(state, "s/1", "u"), 1, "a unit tombstone waits for the head");
  feed(state, batch("s/1", 2, { nodes: [0], transcript: [0] }));
  assert.equal(state.views.get("s/1")?.has("u"), false);
  assert.equal(state.heldRecords, 0);
});

test("VF-1 split unit views: joined in part order once all parts of one asOfSeq are held", () => {
  const { state } = reader();
  const v1 = { items: Array.from({ length: 50 }, (_, i) => `item-${i}`) };
  const parts = split({ sessionId: "s", view: "u", asOfSeq: 5 }, v1, 100);
  assert.ok(parts.length > 3);
  feed(state, parts.slice(0, -1));
  assert.equal(state.views.size, 0, "nothing before part 0");
  feed(state, parts.slice(-1));
  assert.deepEqual(value(state, "s", "u"), v1);
});

test("VF-2 stale parts of an older version (a compacted topic) never count", () => {
  const { state } = reader();
  const old = split({ sessionId: "s", view: "u", asOfSeq: 3 }, "o".repeat(50), 10); // 5 parts
  const v2 = { items: ["new"] };
  const newer = split({ sessionId: "s", view: "u", asOfSeq: 7 }, v2, 10); // 2 parts
  assert.equal(newer.length, 2);
  // what the cleaner left: old parts #4 and #3 (their tombstones expired), then the new version
  feed(state, [old[0]!, old[1]!, ...newer]);
  assert.deepEqual(value(state, "s", "u"), v2);
  assert.equal(state.views.get("s")?.get("u")?.asOfSeq, 7);
  assert.equal(state.stats.badRecords, 0);
});

test("VF-2 a view shrinking to one part: its leftover part tombstones are no-ops", () => {
  const { state } = reader();
  feed(state, split({ sessionId: "s", view: "u", asOfSeq: 1 }, "x".repeat(30), 10));
  feed(state, [tombstone("s", "u", 2), tombstone("s", "u", 1), rec({ sessionId: "s", view: "u", asOfSeq: 2 }, "y")]);
  assert.equal(value(state, "s", "u"), "y");
});

test("VF-5 a '~' record with parts != 1 is unreadable: its head stays incomplete", () => {
  const { state, warnings } = reader();
  const records = batch("s", 1, { bundle: 0, seqs: [0], nodes: [0], transcript: [0] });
  const bundle = records[0]!;
  records[0] = {
    key: bundle.key,
    value: singleObject(body({ sessionId: "s", view: "~b0", asOfSeq: 1, part: 0, parts: 2 }, Buffer.from("[[0,"))),
  };
  feed(state, records);
  assert.equal(state.stats.badRecords, 1);
  assert.match(warnings[0]!, /~b0 is split/);
  assert.equal(state.stats.incompleteHeads, 1);
  assert.equal(state.views.size, 0);
});

test("§5.3 a head of a newer format is skipped and reported", () => {
  const { state, warnings } = reader();
  feed(state, batch("s", 1, { bundle: 0, seqs: [0], nodes: [0], transcript: [0], f: 4 }));
  assert.equal(state.views.size, 0);
  assert.equal(state.stats.incompleteHeads, 1);
  assert.match(warnings.join("\n"), /format 4 is newer than 3/);
});

test("§6 a malformed head is skipped and reported, the session keeps its last complete head", () => {
  const { state, warnings } = reader();
  feed(state, batch("s", 1, { bundle: 0, seqs: [0], nodes: [0], transcript: [0] }));
  feed(state, [rec({ sessionId: "s", view: "~h", asOfSeq: 2 }, { f: 3, ps: 4, nc: 7, nt: [0], tn: 1, tt: [0] })]);
  assert.deepEqual(value(state, "s", "status"), { state: "ok", lastSeq: 1 });
  assert.equal(state.stats.incompleteHeads, 1);
  assert.match(warnings.join("\n"), /s\/~h at \?: unreadable head or record/);
});

test("§6 assembly: surface, messages, transcript pages, index and status from a head", () => {
  const { state } = reader();
  feed(
    state,
    batch("s", 6, { bundle: 0, seqs: [0, 1, 2, 3, 4, 5, 6], nodes: [2, [3], 5, [6, 0]], transcript: [0, 1, 4, 5, 6] }),
  );
  // the override [6, 0] lives in its own record (format 2 name), written before the head
  assert.equal(state.views.size, 0, "incomplete: the override of 6 at generation 0 is missing");
  feed(state, [
    rec({ sessionId: "s", view: "~m6.0", asOfSeq: 6 }, "o6"),
    ...batch("s", 6, { nodes: [2, [3], 5, [6, 0]], transcript: [0, 1, 4, 5, 6] }),
  ]);
  const views = state.views.get("s")!;
  assert.deepEqual(views.get("surface")?.value, { nodes: [2, 3, 5, 6], replaceGeneration: 0, contentGeneration: 0 });
  assert.deepEqual(views.get("messages")?.value, ["m2", "m5", "o6"]);
  assert.deepEqual(views.get("transcript")?.value, { total: 5, pageSize: 4, pages: 2 });
  assert.deepEqual(views.get("transcript.1")?.value, [{ seq: 6, message: "m6" }]);
  assert.deepEqual(views.get("status"), { asOfSeq: 6, stateVersion: -1, value: { state: "ok", lastSeq: 6 } });
  assert.equal(state.stats.incompleteHeads, 1);
});

test("§6 consistency: an incomplete head is skipped, the session shows its last complete head", () => {
  const { state } = reader();
  feed(state, batch("s", 1, { bundle: 0, seqs: [0, 1], nodes: [0], transcript: [0, 1] }));
  feed(state, batch("s", 3, { nodes: [0, 3], transcript: [0, 1, 3] })); // ~b1 with seq 3 not held
  assert.deepEqual(value(state, "s", "status"), { state: "ok", lastSeq: 1 });
  assert.equal(state.stats.incompleteHeads, 1);
  feed(state, batch("s", 3, { bundle: 1, seqs: [3], nodes: [0, 3], transcript: [0, 1, 3] }));
  assert.deepEqual(value(state, "s", "status"), { state: "ok", lastSeq: 3 });
  assert.deepEqual(value(state, "s", "messages"), ["m0", "m3"]);
});

test("VF-4 unit views are gated by heads: never a unit at N+1 beside a status at N", () => {
  const { state } = reader();
  const shown: string[] = [];
  const apply = (records: Rec[]): void => {
    for (const r of records) {
      state.apply(r.key, r.value);
      const views = state.views.get("s");
      shown.push(`${String(views?.get("u")?.asOfSeq)}/${String(views?.get("status")?.asOfSeq)}`);
    }
  };
  apply(batch("s", 1, { bundle: 0, seqs: [0, 1], units: { u: "one" }, nodes: [1], transcript: [0] }));
  apply(batch("s", 2, { bundle: 1, seqs: [2], units: { u: "two" }, nodes: [2], transcript: [0] }));
  // first batch: no head yet, nothing to be inconsistent with; then unit 2 only with status 2
  assert.deepEqual(shown, ["undefined/undefined", "1/undefined", "1/1", "1/1", "1/1", "2/2"]);
  assert.equal(state.heldRecords, 0);
});

test("§7 a tombstone on ~h drops the session's core views, not its units", () => {
  const { state } = reader();
  feed(state, batch("s", 1, { bundle: 0, seqs: [0], units: { u: 1 }, nodes: [0], transcript: [0] }));
  const updates = state.apply(key("s", "~h"), null);
  assert.deepEqual(updates.map((u) => [u.view, u.record]).sort(), [
    ["messages", null],
    ["status", null],
    ["surface", null],
    ["transcript", null],
    ["transcript.0", null],
  ]);
  assert.deepEqual([...state.views.get("s")!.keys()], ["u"]);
  // the rebuild's records come after; its first head assembles again from zero
  feed(state, batch("s", 0, { bundle: 1, seqs: [0], nodes: [0], transcript: [0] }));
  assert.deepEqual(value(state, "s", "status"), { state: "ok", lastSeq: 0 });
});

test("§5.2 format-1 core views read as unit views; their tombstones after a parted head are ignored", () => {
  const { state } = reader();
  feed(state, [rec({ sessionId: "s", view: "status", asOfSeq: 0 }, { state: "ok", lastSeq: 0 })]);
  assert.deepEqual(value(state, "s", "status"), { state: "ok", lastSeq: 0 });
  feed(state, batch("s", 1, { bundle: 0, seqs: [0, 1], nodes: [1], transcript: [0, 1] }));
  feed(state, [tombstone("s", "status"), ...batch("s", 1, { nodes: [1], transcript: [0, 1] })]);
  assert.deepEqual(value(state, "s", "status"), { state: "ok", lastSeq: 1 });
});

test("§5.3 bundle entries of other lengths are ignored (the others keep their positions)", () => {
  const { state } = reader();
  feed(state, [
    rec({ sessionId: "s", view: "~b0", asOfSeq: 2 }, [
      [0, "m0"],
      [1, 2, 3, 4],
      [2, "m2"],
    ]),
    ...batch("s", 2, { nodes: [0, 2], transcript: [] }),
  ]);
  assert.deepEqual(value(state, "s", "messages"), ["m0", "m2"]);
});

test("helpers: the transcript stitched from its pages, the session shaped like processor fold", () => {
  const { state } = reader();
  feed(
    state,
    batch("s", 6, { bundle: 0, seqs: [0, 1, 4, 5, 6], units: { u: 1 }, nodes: [6], transcript: [0, 1, 4, 5, 6] }),
  );
  const views = state.views.get("s")!;
  const transcript = [0, 1, 4, 5, 6].map((seq) => ({ seq, message: `m${seq}` }));
  assert.deepEqual(assembleTranscript(views), transcript);
  assert.deepEqual(foldEquivalent(views), {
    asOfSeq: 6,
    surface: { nodes: [6], replaceGeneration: 0, contentGeneration: 0 },
    messages: ["m6"],
    transcript,
    projections: { u: 1 },
    status: "ok",
  });
  assert.deepEqual(coreViews(views).status, { state: "ok", lastSeq: 6 });
  assert.deepEqual([...unitViews(views).keys()], ["u"]);
  views.delete("transcript.1");
  assert.throws(() => assembleTranscript(views), /transcript page 1 is missing/);
});

test("§6 quarantine: status names the head's q", () => {
  const { state } = reader();
  const q = { seq: 4, rule: "S-1", reason: "seq 5: gap", offset: 9 };
  feed(state, batch("s", 4, { bundle: 0, seqs: [4], nodes: [4], transcript: [4], q }));
  assert.deepEqual(value(state, "s", "status"), { state: "quarantined", lastSeq: 4, quarantine: q });
});

test("bounds: the decoded cache evicts least recently used values, reports once, decodes again", () => {
  const { state, warnings } = reader({ cacheBytes: 16 });
  for (let i = 0; i < 5; i++) {
    feed(
      state,
      batch("s", i, { bundle: i, seqs: [i], nodes: Array.from({ length: i + 1 }, (_, j) => j), transcript: [] }),
    );
  }
  assert.deepEqual(value(state, "s", "messages"), ["m0", "m1", "m2", "m3", "m4"]);
  assert.ok(state.cache.bytes <= 16);
  assert.ok(state.cache.evictions > 0);
  assert.equal(warnings.filter((w) => w.includes("decoded cache reached its bound")).length, 1);
});

test("regressions: a record whose asOfSeq goes back is shown and reported", () => {
  const { state, warnings } = reader();
  feed(state, [rec({ sessionId: "s", view: "u", asOfSeq: 5 }, "five")]);
  const updates = state.apply(
    ...(Object.values(rec({ sessionId: "s", view: "u", asOfSeq: 3 }, "three")) as [Buffer, Buffer]),
  );
  assert.equal(value(state, "s", "u"), "three");
  assert.equal(updates[0]?.regressedFrom, 5);
  assert.deepEqual(state.regressions, [{ sessionId: "s", view: "u", asOfSeq: 3, previous: 5 }]);
  assert.match(warnings[0]!, /went back from asOfSeq 5 to 3/);
});
