/**
 * Values of the views topic: framing (docs/views-format.md section 2), the
 * Avro body, and the JSON payload (plain or one zstd frame).
 *
 * Single-object values (`C3 01` + 8-byte CRC-64-AVRO fingerprint) name their
 * writer schema by fingerprint, looked up among the schemas this package
 * knows.  Confluent values (`00` + 4-byte big-endian id) name it by registry
 * id: {@link ViewCodec.prepare} fetches an unknown id once through a
 * {@link SchemaLookup}, after which {@link ViewCodec.decode} is synchronous.
 */
import avro from "avsc";
import { decompress } from "fzstd";

import { VIEW_HISTORY, VIEW_SCHEMA, crc64Avro } from "./schema.js";

export type ViewEncoding = "JSON" | "ZSTD_JSON";

/** One decoded `View` record (one part of a split view when `parts > 1`). */
export interface ViewValue {
  sessionId: string;
  view: string;
  asOfSeq: number;
  stateVersion: number;
  encoding: ViewEncoding;
  value: Buffer;
  part: number;
  parts: number;
}

/** A value this reader cannot decode: skipped and reported, never a crash. */
export class CodecError extends Error {
  override name = "CodecError";
}

/** Writer schema (JSON) of a Confluent schema id. */
export type SchemaLookup = (id: number) => Promise<unknown>;

/** The schema registry did not answer (network, 5xx, 429): worth a retry, not a bad record. */
export class RegistryUnavailable extends Error {
  override name = "RegistryUnavailable";
}

/** A {@link SchemaLookup} asking a schema registry (`GET <url>/schemas/ids/<id>`). */
export function registryLookup(url: string, headers: Record<string, string> = {}): SchemaLookup {
  const base = url.replace(/\/+$/, "");
  return async (id: number) => {
    let response: Response;
    try {
      response = await fetch(`${base}/schemas/ids/${id}`, { headers, signal: AbortSignal.timeout(10_000) });
    } catch (err) {
      throw new RegistryUnavailable(`schema registry: id ${id}: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (response.status >= 500 || response.status === 429) {
      throw new RegistryUnavailable(`schema registry: id ${id}: HTTP ${response.status}`);
    }
    if (!response.ok) throw new CodecError(`schema registry: id ${id}: HTTP ${response.status}`);
    const body = (await response.json()) as { schema?: unknown };
    if (typeof body.schema !== "string") throw new CodecError(`schema registry: id ${id}: no schema`);
    return JSON.parse(body.schema) as unknown;
  };
}

/** How to read a body: the reader type, with a resolver unless the writer is the reader. */
interface Plan {
  resolver: avro.Resolver | undefined;
}

const SINGLE_OBJECT = 0xc3;
const CONFLUENT = 0x00;

/** The reader type, built once (avsc types are immutable). */
const READER = avro.Type.forSchema(VIEW_SCHEMA as unknown as avro.Schema);
const READER_FINGERPRINT = crc64Avro(JSON.stringify(READER.schema())).toString("hex");

export class ViewCodec {
  private readonly reader = READER;
  private readonly byFingerprint = new Map<string, Plan>();
  /** Confluent id -> its plan, or why the id cannot be read as a View */
  private readonly byId = new Map<number, Plan | string>();

  constructor(private readonly lookup?: SchemaLookup) {
    this.byFingerprint.set(READER_FINGERPRINT, { resolver: undefined });
    for (const schema of VIEW_HISTORY) this.addWriter(schema);
  }

  /** Learn the writer schema of a Confluent id (what a registry would answer). */
  addSchemaId(id: number, schema: unknown): void {
    try {
      this.byId.set(id, this.addWriter(schema));
    } catch (err) {
      this.byId.set(id, err instanceof Error ? err.message : String(err)); // a record naming it is bad
    }
  }

  /**
   * Make {@link decode} able to read `data`: fetch its Confluent schema id if
   * unknown.  An id the registry does not know is remembered as bad; an
   * unavailable registry is retried (`attempts`, backoff up to 2 s), then
   * {@link RegistryUnavailable} is thrown and nothing is remembered.
   */
  async prepare(data: Buffer, attempts = 5): Promise<void> {
    if (data.length < 5 || data[0] !== CONFLUENT) return;
    const id = data.readUInt32BE(1);
    if (this.byId.has(id) || this.lookup === undefined) return;
    for (let attempt = 1, delay = 250; ; attempt++, delay = Math.min(delay * 2, 2000)) {
      try {
        this.addSchemaId(id, await this.lookup(id));
        return;
      } catch (err) {
        if (!(err instanceof RegistryUnavailable)) {
          this.byId.set(id, err instanceof Error ? err.message : String(err));
          return;
        }
        if (attempt >= attempts) throw err;
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }

  /** The `View` in `data`; throws {@link CodecError} for anything unreadable. */
  decode(data: Buffer): ViewValue {
    let plan: Plan | undefined;
    let offset: number;
    if (data[0] === SINGLE_OBJECT && data[1] === 0x01) {
      if (data.length < 10) throw new CodecError(`truncated single-object header (${data.length} bytes)`);
      const fp = data.subarray(2, 10).toString("hex");
      plan = this.byFingerprint.get(fp);
      if (plan === undefined) {
        throw new CodecError(`unknown writer schema fingerprint ${fp} (a newer writer: upgrade the reader)`);
      }
      offset = 10;
    } else if (data[0] === CONFLUENT) {
      if (data.length < 5) throw new CodecError(`truncated Confluent header (${data.length} bytes)`);
      const id = data.readUInt32BE(1);
      const known = this.byId.get(id);
      if (known === undefined || typeof known === "string") {
        const why = known ?? (this.lookup ? "not fetched" : "no schema registry configured");
        throw new CodecError(`schema id ${id}: ${why}`);
      }
      plan = known;
      offset = 5;
    } else {
      const head = data.subarray(0, 2).toString("hex") || "nothing";
      throw new CodecError(
        `not a framed Avro record: starts with ${head} (expected c301 single-object marker or 00 Confluent magic)`,
      );
    }
    let decoded: { value: unknown; offset: number };
    try {
      decoded = this.reader.decode(data, offset, plan.resolver);
    } catch (err) {
      throw new CodecError(`corrupt View body: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (decoded.offset !== data.length) {
      const why = decoded.offset < 0 ? "truncated" : `${data.length - decoded.offset} trailing byte(s) after`;
      throw new CodecError(`${why} the View body`);
    }
    return decoded.value as ViewValue;
  }

  private addWriter(schema: unknown): Plan {
    const writer = avro.Type.forSchema(schema as avro.Schema);
    const fp = this.fingerprint(writer);
    const known = this.byFingerprint.get(fp);
    if (known !== undefined) return known;
    let resolver: avro.Resolver;
    try {
      resolver = this.reader.createResolver(writer);
    } catch (err) {
      throw new CodecError(`writer schema cannot be read as View: ${err instanceof Error ? err.message : String(err)}`);
    }
    const plan = { resolver };
    this.byFingerprint.set(fp, plan);
    return plan;
  }

  private fingerprint(type: avro.Type): string {
    return crc64Avro(JSON.stringify(type.schema())).toString("hex");
  }
}

/** The JSON value of a whole payload (`encoding` says whether it is zstd). */
export function decodePayload(encoding: ViewEncoding, payload: Uint8Array): unknown {
  let raw: Uint8Array;
  if (encoding === "JSON") raw = payload;
  else if (encoding === "ZSTD_JSON") {
    try {
      raw = decompress(payload);
    } catch (err) {
      throw new CodecError(`corrupt zstd payload: ${err instanceof Error ? err.message : String(err)}`);
    }
  } else throw new CodecError(`unknown payload encoding ${String(encoding)}`);
  try {
    return JSON.parse(Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString("utf8"));
  } catch (err) {
    throw new CodecError(`payload is not valid JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
}
