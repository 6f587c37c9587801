/**
 * The views conformance corpus (clients/conformance/views/*.json, format in
 * its README): fed every record in order, the reader shows exactly each
 * `expect` step's views of its session, and `final` at the end.
 */
import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { test } from "node:test";

import { ViewCodec } from "../src/codec.js";
import { assembleTranscript } from "../src/shape.js";
import { ViewsState, type SessionViews } from "../src/state.js";

const CORPUS = process.env["VIEWS_CORPUS_DIR"] ?? path.resolve(__dirname, "../../../conformance/views");

interface Step {
  record?: { partition: number; offset: number; key: string; value: string | null };
  expect?: { session: string; assembled: boolean; views: Record<string, unknown> };
  compaction?: unknown;
}

interface Case {
  corpus: number;
  case: string;
  registry?: Record<string, unknown>;
  steps: Step[];
  final: Record<string, Record<string, unknown>>;
}

function plain(views: SessionViews | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [name, r] of views ?? []) out[name] = r;
  return JSON.parse(JSON.stringify(out)) as Record<string, unknown>;
}

export function runCase(doc: Case): void {
  assert.equal(doc.corpus, 1, `${doc.case}: corpus format ${doc.corpus} is not 1`);
  const codec = new ViewCodec();
  for (const [id, schema] of Object.entries(doc.registry ?? {})) codec.addSchemaId(Number(id), schema);
  const warnings: string[] = [];
  const state = new ViewsState({ codec, warn: (line) => warnings.push(line) });
  let lastIncomplete = 0;
  doc.steps.forEach((step, i) => {
    if (step.record !== undefined) {
      const r = step.record;
      lastIncomplete = state.stats.incompleteHeads;
      state.apply(
        Buffer.from(r.key, "base64"),
        r.value === null ? null : Buffer.from(r.value, "base64"),
        `${r.partition}@${r.offset}`,
      );
    } else if (step.expect !== undefined) {
      const e = step.expect;
      const where = `${doc.case}: step ${i} (session ${e.session})`;
      assert.deepEqual(plain(state.views.get(e.session)), e.views, `${where}: views differ`);
      const views = state.views.get(e.session);
      if (views?.has("transcript")) assembleTranscript(views); // the pages the index counts are all there
      const assembled = state.stats.incompleteHeads === lastIncomplete;
      assert.equal(assembled, e.assembled, `${where}: head assembled ${assembled}, expected ${e.assembled}`);
    }
  });
  const final: Record<string, unknown> = {};
  for (const [sid, views] of state.views) if (views.size > 0) final[sid] = plain(views);
  assert.deepEqual(final, doc.final, `${doc.case}: final views differ`);
  assert.equal(state.stats.badRecords, 0, `${doc.case}: unreadable records: ${warnings.join("; ")}`);
}

const cases = existsSync(CORPUS)
  ? readdirSync(CORPUS)
      .filter((f) => f.endsWith(".json"))
      .sort()
  : [];

if (cases.length === 0) {
  test("conformance corpus", { skip: `no corpus at ${CORPUS} (clients/conformance/views/*.json)` }, () => {});
}

for (const file of cases) {
  test(`conformance: ${file}`, () => {
    runCase(JSON.parse(readFileSync(path.join(CORPUS, file), "utf8")) as Case);
  });
}
