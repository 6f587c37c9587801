/**
 * Unit views: reassembly of split records (docs/views-format.md section 4)
 * and the gate that holds a session's unit records until its next head
 * (section 6).
 */
import { CodecError, type ViewValue } from "./codec.js";

/**
 * Reader-side reassembly of split views: {@link add} each record in
 * consumption order; it returns the whole view once complete (at once for an
 * unsplit one).  Parts older than the newest version seen of that view are
 * ignored; a newer version drops the pending parts of an older one.  Pending
 * parts are at most one version per view.
 */
export class SplitAssembler {
  private readonly pending = new Map<string, { asOf: number; parts: number; got: Map<number, ViewValue> }>();
  private readonly latest = new Map<string, number>();

  add(record: ViewValue): ViewValue | null {
    const ident = `${record.sessionId}\u0000${record.view}`;
    const latest = this.latest.get(ident);
    if (latest !== undefined && record.asOfSeq < latest) return null;
    this.latest.set(ident, record.asOfSeq);
    if (record.parts === 1) {
      this.pending.delete(ident);
      return record;
    }
    let pending = this.pending.get(ident);
    if (pending === undefined || pending.asOf !== record.asOfSeq || pending.parts !== record.parts) {
      pending = { asOf: record.asOfSeq, parts: record.parts, got: new Map() };
      this.pending.set(ident, pending);
    }
    if (record.part < 0 || record.part >= record.parts) return null; // a leftover part
    pending.got.set(record.part, record);
    if (pending.got.size < record.parts) return null;
    this.pending.delete(ident);
    return joinParts([...pending.got.values()]);
  }

  /** Drop what is known of a view (removed, or its asOfSeq went back). */
  forget(sessionId: string, view: string): void {
    const ident = `${sessionId}\u0000${view}`;
    this.pending.delete(ident);
    this.latest.delete(ident);
  }

  /** Views waiting for parts. */
  get waiting(): number {
    return this.pending.size;
  }
}

/** The parts of one split view (any order) as one whole record. */
export function joinParts(parts: ViewValue[]): ViewValue {
  const items = [...parts].sort((a, b) => a.part - b.part);
  const head = items[0];
  if (head === undefined) throw new CodecError("no view parts to join");
  for (const [i, item] of items.entries()) {
    if (
      item.part !== i ||
      item.asOfSeq !== head.asOfSeq ||
      item.stateVersion !== head.stateVersion ||
      item.encoding !== head.encoding ||
      item.parts !== head.parts
    ) {
      throw new CodecError(`view parts of ${head.sessionId}/${head.view} disagree`);
    }
  }
  if (items.length !== head.parts) {
    throw new CodecError(`view ${head.sessionId}/${head.view}@${head.asOfSeq} needs ${head.parts} parts`);
  }
  return { ...head, value: Buffer.concat(items.map((p) => p.value)), part: 0, parts: 1 };
}

/**
 * Unit records gated by heads.  Once a session has a head, its unit records
 * (and unit tombstones) are held here and applied when its next head
 * arrives: the head is the last record of the session in every transaction,
 * so what is held is at most one transaction's records, one per key.  A
 * session without a head yet (its first batch, or a format-1 writer) is not
 * gated: there is nothing to be inconsistent with.
 */
export class UnitGate {
  private readonly gated = new Set<string>();
  /** session -> key -> the record (null: a tombstone), in write order */
  private readonly held = new Map<string, Map<string, ViewValue | null>>();

  /** Keep `record` for the session's next head; false when the session is not gated. */
  hold(sessionId: string, key: string, record: ViewValue | null): boolean {
    if (!this.gated.has(sessionId)) return false;
    let records = this.held.get(sessionId);
    if (records === undefined) this.held.set(sessionId, (records = new Map()));
    records.delete(key); // the newest record of a key, at its place in order
    records.set(key, record);
    return true;
  }

  /** At a head of the session: what it held, in order; gated from now on. */
  release(sessionId: string): [string, ViewValue | null][] {
    this.gated.add(sessionId);
    return this.take(sessionId);
  }

  /** At a tombstone on the session's head: what it held; not gated any more. */
  reset(sessionId: string): [string, ViewValue | null][] {
    this.gated.delete(sessionId);
    return this.take(sessionId);
  }

  get heldRecords(): number {
    let n = 0;
    for (const records of this.held.values()) n += records.size;
    return n;
  }

  private take(sessionId: string): [string, ViewValue | null][] {
    const records = this.held.get(sessionId);
    this.held.delete(sessionId);
    return records === undefined ? [] : [...records.entries()];
  }
}
