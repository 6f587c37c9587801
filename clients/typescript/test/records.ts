/** Test records of the views topic, framed as the processor frames them. */
import avro from "avsc";

import { VIEW_SCHEMA, crc64Avro } from "../src/schema.js";

const TYPE = avro.Type.forSchema(VIEW_SCHEMA as unknown as avro.Schema);
export const FINGERPRINT = crc64Avro(JSON.stringify(TYPE.schema()));

export interface Rec {
  key: Buffer;
  value: Buffer | null;
}

export interface ViewFields {
  sessionId: string;
  view: string;
  asOfSeq: number;
  stateVersion?: number;
  part?: number;
  parts?: number;
}

/** A zstd frame holding `raw` in raw blocks (valid zstd, no compression needed). */
export function zstdFrame(raw: Buffer): Buffer {
  const head = Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0xa0, 0, 0, 0, 0]); // single segment, 4-byte size
  head.writeUInt32LE(raw.length, 5);
  const blocks: Buffer[] = [head];
  const max = 128 * 1024;
  for (let at = 0; at === 0 || at < raw.length; at += max) {
    const chunk = raw.subarray(at, at + max);
    const last = at + max >= raw.length ? 1 : 0;
    const header = (chunk.length << 3) | last; // block type 0: raw
    blocks.push(Buffer.from([header & 0xff, (header >> 8) & 0xff, (header >> 16) & 0xff]), chunk);
  }
  return Buffer.concat(blocks);
}

export function body(fields: ViewFields, payload: Buffer, encoding: "JSON" | "ZSTD_JSON" = "JSON"): Buffer {
  return TYPE.toBuffer({
    stateVersion: -1,
    part: 0,
    parts: 1,
    ...fields,
    encoding,
    value: payload,
  });
}

export function singleObject(b: Buffer): Buffer {
  return Buffer.concat([Buffer.from([0xc3, 0x01]), FINGERPRINT, b]);
}

export function confluent(id: number, b: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(id, 1);
  return Buffer.concat([head, b]);
}

export function key(sessionId: string, name: string, part = 0): Buffer {
  return Buffer.from(part === 0 ? `${sessionId}/${name}` : `${sessionId}/${name}#${part}`);
}

/** One whole record of `value` (JSON), single-object framed. */
export function rec(fields: ViewFields, value: unknown, zstd = false): Rec {
  const json = Buffer.from(JSON.stringify(value));
  const payload = zstd ? zstdFrame(json) : json;
  return {
    key: key(fields.sessionId, fields.view, fields.part ?? 0),
    value: singleObject(body(fields, payload, zstd ? "ZSTD_JSON" : "JSON")),
  };
}

/** The parts of a split unit view of `value` (chunks of `size` bytes), parts N-1..1 first, part 0 last. */
export function split(fields: ViewFields, value: unknown, size: number): Rec[] {
  const json = Buffer.from(JSON.stringify(value));
  const chunks: Buffer[] = [];
  for (let at = 0; at < json.length; at += size) chunks.push(json.subarray(at, at + size));
  const out = chunks.map((chunk, part) => ({
    key: key(fields.sessionId, fields.view, part),
    value: singleObject(body({ ...fields, part, parts: chunks.length }, chunk)),
  }));
  return out.reverse();
}

export function tombstone(sessionId: string, name: string, part = 0): Rec {
  return { key: key(sessionId, name, part), value: null };
}

/**
 * One session's transaction in format 3: a bundle with the messages of
 * `seqs` (message of seq s = `m<s>`), the units, then the head naming
 * all of `nodes` (refs) and the transcript `transcript` (seqs).
 */
export function batch(
  sid: string,
  asOf: number,
  opts: {
    bundle?: number;
    seqs?: number[];
    units?: Record<string, unknown>;
    nodes: unknown[];
    transcript: number[];
    q?: unknown;
    f?: number;
  },
): Rec[] {
  const out: Rec[] = [];
  if (opts.bundle !== undefined) {
    out.push(
      rec(
        { sessionId: sid, view: `~b${opts.bundle}`, asOfSeq: asOf },
        (opts.seqs ?? []).map((s) => [s, `m${s}`]),
      ),
    );
  }
  for (const [name, value] of Object.entries(opts.units ?? {})) {
    out.push(rec({ sessionId: sid, view: name, asOfSeq: asOf, stateVersion: 1 }, value));
  }
  const head: Record<string, unknown> = {
    f: opts.f ?? 3,
    ps: 4,
    rg: 0,
    cg: 0,
    nc: [],
    nt: opts.nodes,
    tn: opts.transcript.length,
    tt: opts.transcript,
  };
  if (opts.q !== undefined) head["q"] = opts.q;
  out.push(rec({ sessionId: sid, view: "~h", asOfSeq: asOf }, head));
  return out;
}
