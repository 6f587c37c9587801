/**
 * `npm run bench`: how fast `ViewsState` applies records (decode, assemble),
 * on the conformance corpus replayed `ROUNDS` times into fresh readers (no
 * Kafka: the reader's own cost).  Prints records/s and payload MB/s.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";

import { ViewCodec } from "../src/codec.js";
import { ViewsState } from "../src/state.js";

const CORPUS = process.env["VIEWS_CORPUS_DIR"] ?? path.resolve(__dirname, "../../../conformance/views");
const ROUNDS = Number(process.env["ROUNDS"] ?? 20);

if (!existsSync(CORPUS)) {
  console.error(`no corpus at ${CORPUS}`);
  process.exit(1);
}
const cases = readdirSync(CORPUS)
  .filter((f) => f.endsWith(".json"))
  .map(
    (f) =>
      JSON.parse(readFileSync(path.join(CORPUS, f), "utf8")) as {
        registry?: Record<string, unknown>;
        steps: { record?: { key: string; value: string | null } }[];
      },
  )
  .map((doc) => ({
    registry: doc.registry ?? {},
    records: doc.steps.flatMap((s) =>
      s.record
        ? [
            [
              Buffer.from(s.record.key, "base64"),
              s.record.value === null ? null : Buffer.from(s.record.value, "base64"),
            ] as const,
          ]
        : [],
    ),
  }));
let records = 0;
let bytes = 0;
const start = process.hrtime.bigint();
for (let round = 0; round < ROUNDS; round++) {
  for (const c of cases) {
    const codec = new ViewCodec();
    for (const [id, schema] of Object.entries(c.registry)) codec.addSchemaId(Number(id), schema);
    const state = new ViewsState({ codec, warn: () => {} });
    for (const [key, value] of c.records) {
      state.apply(key, value);
      records++;
      bytes += value?.length ?? 0;
    }
  }
}
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
console.log(
  `${records} records (${(bytes / 1e6).toFixed(1)} MB) in ${seconds.toFixed(2)} s: ` +
    `${Math.round(records / seconds)} records/s, ${(bytes / 1e6 / seconds).toFixed(1)} MB/s`,
);
