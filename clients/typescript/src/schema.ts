/**
 * The `processor.v1.View` Avro schema (the repository's `schemas/view.avsc`
 * without its docs), the reader schema of every value.  A test checks
 * that this copy has the fingerprint and defaults of the repository's file,
 * so the package stays self-contained when published.
 */
export const VIEW_SCHEMA = {
  type: "record",
  name: "View",
  namespace: "processor.v1",
  fields: [
    { name: "sessionId", type: "string" },
    { name: "view", type: "string" },
    { name: "asOfSeq", type: "long" },
    { name: "stateVersion", type: "int" },
    {
      name: "encoding",
      type: { type: "enum", name: "ViewEncoding", symbols: ["JSON", "ZSTD_JSON"] },
    },
    { name: "value", type: "bytes" },
    { name: "part", type: "int", default: 0 },
    { name: "parts", type: "int", default: 1 },
  ],
} as const;

/** Writer schemas of `View` older than the current one (none yet). */
export const VIEW_HISTORY: readonly object[] = [];

const EMPTY = 0xc15d213aa4d7a795n;
const MASK = 0xffffffffffffffffn;
const TABLE: bigint[] = (() => {
  const table: bigint[] = [];
  for (let i = 0; i < 256; i++) {
    let fp = BigInt(i);
    for (let j = 0; j < 8; j++) fp = (fp >> 1n) ^ (EMPTY & -(fp & 1n) & MASK);
    table.push(fp);
  }
  return table;
})();

/** CRC-64-AVRO of `text` (a schema's Parsing Canonical Form), little-endian. */
export function crc64Avro(text: string): Buffer {
  let fp = EMPTY;
  for (const b of Buffer.from(text, "utf8")) {
    fp = (fp >> 8n) ^ TABLE[Number((fp ^ BigInt(b)) & 0xffn)]!;
  }
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(fp);
  return out;
}
