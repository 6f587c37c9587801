/**
 * Decoded values of parted records, least recently used evicted first.
 *
 * Assembling a head decodes every message of the surface; keeping them
 * decoded saves that work per head, but without a bound the cache grows with
 * the whole topic (next to the encoded records the reader must hold anyway).
 * The bound counts the encoded size of the records held decoded; an evicted
 * value is decoded again from its record when a head needs it.  Hitting the
 * bound is reported once and counted in `evictions` (the Python reader's
 * `DecodedCache`, same default).
 */
import { decodePayload, type ViewValue } from "./codec.js";

export const DECODED_CACHE_BYTES = 64 * 1024 * 1024;

export class DecodedCache {
  bytes = 0;
  evictions = 0;
  /** Map iteration order is insertion order: re-inserting a key marks it recent. */
  private readonly values = new Map<string, { value: unknown; cost: number }>();

  constructor(
    readonly maxBytes: number = DECODED_CACHE_BYTES,
    private readonly warn: (line: string) => void = () => {},
  ) {
    if (!(maxBytes >= 0)) throw new RangeError(`decoded cache bound must be >= 0, got ${maxBytes}`);
  }

  get size(): number {
    return this.values.size;
  }

  get(sessionId: string, name: string, record: ViewValue): unknown {
    const key = `${sessionId}\u0000${name}`;
    const hit = this.values.get(key);
    if (hit !== undefined) {
      this.values.delete(key);
      this.values.set(key, hit);
      return hit.value;
    }
    const value = decodePayload(record.encoding, record.value);
    const cost = record.value.length;
    this.values.set(key, { value, cost });
    this.bytes += cost;
    for (const [old, entry] of this.values) {
      if (this.bytes <= this.maxBytes) break;
      this.values.delete(old);
      this.bytes -= entry.cost;
      if (this.evictions === 0) {
        this.warn(
          `views reader: decoded cache reached its bound of ${this.maxBytes} bytes; evicting ` +
            "least recently used values (decoded again when needed)",
        );
      }
      this.evictions++;
    }
    return value;
  }

  drop(sessionId: string, name: string): void {
    const key = `${sessionId}\u0000${name}`;
    const hit = this.values.get(key);
    if (hit !== undefined) {
      this.values.delete(key);
      this.bytes -= hit.cost;
    }
  }
}
