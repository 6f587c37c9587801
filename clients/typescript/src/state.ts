/**
 * The views of every session, from the views topic's records in the order a
 * subscriber receives them (docs/views-format.md): newest record per key,
 * split unit views joined, tombstones applied, unit records gated by heads,
 * core views assembled from the parted records on every complete head.
 *
 * {@link ViewsState.apply} takes one record and returns the view updates it
 * completes; it never throws on bad input: an unreadable value is reported
 * through `warn` and counted in `stats.badRecords`, a head that cannot be
 * assembled yet in `stats.incompleteHeads`.  A view whose `asOfSeq` goes
 * backwards (a processor published from a stale state) is shown, not hidden,
 * and reported (`regressions`, `ViewUpdate.regressedFrom`).
 */
import { DECODED_CACHE_BYTES, DecodedCache } from "./cache.js";
import { CodecError, decodePayload, ViewCodec, type ViewValue } from "./codec.js";
import { keyOf, keySession } from "./keys.js";
import {
  assemble,
  CORE_STATE_VERSION,
  CORE_VIEWS,
  isInternalView,
  isTranscriptPage,
  SessionParts,
  VIEW_HEAD,
} from "./parted.js";
import { SplitAssembler, UnitGate } from "./units.js";

/** One view of one session; `value` is decoded JSON. */
export interface ViewRecord {
  asOfSeq: number;
  stateVersion: number;
  value: unknown;
}

/** A session's views by name (units, `messages`, `surface`, `status`, `transcript`, `transcript.<n>`). */
export type SessionViews = Map<string, ViewRecord>;

/** A committed change of one view; `record` null when the view was removed. */
export interface ViewUpdate {
  sessionId: string;
  view: string;
  record: ViewRecord | null;
  /** the higher `asOfSeq` this view had before, when this record went backwards */
  regressedFrom?: number;
}

export interface ViewRegression {
  sessionId: string;
  view: string;
  asOfSeq: number;
  previous: number;
}

export interface StateOptions {
  /** Bound of the decoded parted records kept besides the views (bytes, default 64 MiB). */
  cacheBytes?: number;
  /** Keep only this session's views. */
  session?: string;
  /** Where problems are reported (one line each); default: console.warn. */
  warn?: (line: string) => void;
  /** Decoder of values (to share a schema registry lookup); default: single-object only. */
  codec?: ViewCodec;
}

/** How many of at most this many regressions are kept (the rest are counted). */
const MAX_REGRESSIONS = 1000;

export class ViewsState {
  readonly views = new Map<string, SessionViews>();
  readonly codec: ViewCodec;
  readonly cache: DecodedCache;
  readonly regressions: ViewRegression[] = [];
  readonly stats = {
    records: 0,
    tombstones: 0,
    badRecords: 0,
    heads: 0,
    incompleteHeads: 0,
    regressions: 0,
    splitViews: 0,
  };
  private readonly warn: (line: string) => void;
  private readonly session: string | undefined;
  private readonly parted = new Map<string, SessionParts>();
  /** key -> (session, name) of the parted records held (a tombstone has only its key) */
  private readonly partedKeys = new Map<string, [string, string]>();
  /** key -> (session, name) of the unit views shown (part 0 keys) */
  private readonly unitKeys = new Map<string, [string, string]>();
  /** sessions whose core views come from parted heads */
  private readonly assembledSessions = new Set<string>();
  private readonly splits = new SplitAssembler();
  private readonly gate = new UnitGate();
  /** highest asOfSeq read per (session, view), to see a record go backwards */
  private readonly seen = new Map<string, number>();
  private readonly regressed = new Map<string, number>();

  constructor(options: StateOptions = {}) {
    this.warn = options.warn ?? ((line) => console.warn(line));
    this.session = options.session;
    this.codec = options.codec ?? new ViewCodec();
    this.cache = new DecodedCache(options.cacheBytes ?? DECODED_CACHE_BYTES, this.warn);
  }

  /** Views of one session (undefined when it has none). */
  sessionViews(sessionId: string): SessionViews | undefined {
    return this.views.get(sessionId);
  }

  /** Unit records waiting for their session's next head. */
  get heldRecords(): number {
    return this.gate.heldRecords;
  }

  /** Take one record (`value` null: a tombstone); the view updates it completes, in order. */
  apply(key: Buffer | null, value: Buffer | null, where = ""): ViewUpdate[] {
    this.stats.records++;
    if (value === null) {
      this.stats.tombstones++;
      return key === null ? [] : this.tombstone(keyOf(key));
    }
    let record: ViewValue;
    try {
      record = this.codec.decode(value);
    } catch (err) {
      return this.bad(where, err);
    }
    if (this.session !== undefined && record.sessionId !== this.session) return [];
    const k = key === null ? null : keyOf(key);
    if (isInternalView(record.view)) {
      if (record.parts !== 1) {
        return this.bad(
          where,
          new CodecError(`VF-5: ${record.sessionId}/${record.view} is split (parts ${record.parts})`),
        );
      }
      let out: ViewUpdate[] = [];
      if (record.view === VIEW_HEAD) out = this.released(this.gate.release(record.sessionId));
      return out.concat(this.putParted(k, record, where));
    }
    if (k !== null && this.gate.hold(record.sessionId, k, record)) return [];
    return this.unit(k, record, where);
  }

  private bad(where: string, err: unknown): ViewUpdate[] {
    this.stats.badRecords++;
    this.warn(
      `views reader: unreadable record${where ? ` at ${where}` : ""}: ${err instanceof Error ? err.message : String(err)}`,
    );
    return [];
  }

  private released(held: [string, ViewValue | null][]): ViewUpdate[] {
    const out: ViewUpdate[] = [];
    for (const [key, record] of held)
      out.push(...(record === null ? this.unitTombstone(key) : this.unit(key, record, "")));
    return out;
  }

  /** A unit view record (or a format-1 core view), applied now. */
  private unit(key: string | null, record: ViewValue, where: string): ViewUpdate[] {
    if (record.part === 0 && key !== null) this.unitKeys.set(key, [record.sessionId, record.view]);
    const ident = `${record.sessionId}\u0000${record.view}`;
    this.checkRegression(record.sessionId, record.view, record.asOfSeq);
    let whole: ViewValue | null;
    let value: unknown;
    try {
      whole = this.splits.add(record);
      if (whole === null) return []; // waiting for the other parts of a split view
      if (record.parts > 1) this.stats.splitViews++;
      value = decodePayload(whole.encoding, whole.value);
    } catch (err) {
      return this.bad(where, err);
    }
    const shown: ViewRecord = { asOfSeq: whole.asOfSeq, stateVersion: whole.stateVersion, value };
    this.sessionMap(whole.sessionId).set(whole.view, shown);
    const update: ViewUpdate = { sessionId: whole.sessionId, view: whole.view, record: shown };
    const from = this.regressed.get(ident);
    if (from !== undefined) {
      this.regressed.delete(ident);
      update.regressedFrom = from;
    }
    return [update];
  }

  private tombstone(key: string): ViewUpdate[] {
    const parted = this.removeParted(key);
    if (parted !== null) {
      const [sid, name] = parted;
      if (name !== VIEW_HEAD) return [];
      // the session is rebuilt from zero: its assembled views go
      const out = this.released(this.gate.reset(sid));
      this.assembledSessions.delete(sid);
      this.seen.delete(`${sid}\u0000${VIEW_HEAD}`);
      const views = this.views.get(sid);
      for (const name of [...(views?.keys() ?? [])]) {
        if (CORE_VIEWS.has(name) || isTranscriptPage(name)) {
          views!.delete(name);
          out.push({ sessionId: sid, view: name, record: null });
        }
      }
      this.dropEmpty(sid);
      return out;
    }
    const sid = this.unitKeys.get(key)?.[0] ?? keySession(key);
    if (sid !== null && this.gate.hold(sid, key, null)) return [];
    return this.unitTombstone(key);
  }

  private unitTombstone(key: string): ViewUpdate[] {
    const ident = this.unitKeys.get(key);
    if (ident === undefined) return [];
    this.unitKeys.delete(key);
    const [sid, name] = ident;
    if (this.assembledSessions.has(sid) && (CORE_VIEWS.has(name) || isTranscriptPage(name))) {
      return []; // a format-1 record the parted format took over
    }
    this.splits.forget(sid, name);
    this.seen.delete(`${sid}\u0000${name}`); // a removed view may start again lower
    const existed = this.views.get(sid)?.delete(name) ?? false;
    this.dropEmpty(sid);
    return existed ? [{ sessionId: sid, view: name, record: null }] : [];
  }

  private putParted(key: string | null, record: ViewValue, where: string): ViewUpdate[] {
    const sid = record.sessionId;
    let parts = this.parted.get(sid);
    if (parts === undefined) this.parted.set(sid, (parts = new SessionParts(sid, this.cache, this.warn)));
    if (key !== null) this.partedKeys.set(key, [sid, record.view]);
    parts.put(record);
    if (record.view !== VIEW_HEAD) return [];
    this.stats.heads++;
    let head: unknown;
    try {
      head = decodePayload(record.encoding, record.value);
      if (typeof head !== "object" || head === null || Array.isArray(head))
        throw new CodecError("head is not a JSON object");
    } catch (err) {
      this.stats.incompleteHeads++;
      return this.bad(where, err);
    }
    const result = assemble(parts, record, head as Record<string, unknown>);
    if (!result.assembled) {
      this.stats.incompleteHeads++;
      // a head missing records is normal on a compacted topic (counted); a newer or broken one is news
      if (!result.reason.startsWith("missing"))
        this.warn(`views reader: ${sid}/~h at ${where || "?"}: ${result.reason}`);
      return [];
    }
    const regressed = this.checkRegression(sid, VIEW_HEAD, record.asOfSeq);
    this.regressed.delete(`${sid}\u0000${VIEW_HEAD}`);
    this.assembledSessions.add(sid);
    const current = this.sessionMap(sid);
    const out: ViewUpdate[] = [];
    for (const [name, value] of result.views) {
      const old = current.get(name);
      if (old !== undefined && regressed === null && jsonEqual(old.value, value)) continue;
      const shown: ViewRecord = { asOfSeq: record.asOfSeq, stateVersion: CORE_STATE_VERSION, value };
      current.set(name, shown);
      const update: ViewUpdate = { sessionId: sid, view: name, record: shown };
      if (regressed !== null && name === "status") update.regressedFrom = regressed;
      out.push(update);
    }
    return out;
  }

  /** Forget the parted record under `key`: its (session, name), null if unknown. */
  private removeParted(key: string): [string, string] | null {
    const ident = this.partedKeys.get(key);
    if (ident === undefined) return null;
    this.partedKeys.delete(key);
    const [sid, name] = ident;
    const parts = this.parted.get(sid);
    if (parts !== undefined) {
      if (name === VIEW_HEAD) {
        parts.clear();
        this.parted.delete(sid);
      } else parts.drop(name);
    }
    return ident;
  }

  private checkRegression(sessionId: string, view: string, asOf: number): number | null {
    const ident = `${sessionId}\u0000${view}`;
    const seen = this.seen.get(ident);
    this.seen.set(ident, asOf);
    if (seen === undefined || asOf >= seen) return null;
    // the latest record wins: let the split assembler take the lower version
    this.splits.forget(sessionId, view);
    this.regressed.set(ident, seen);
    this.stats.regressions++;
    if (this.regressions.length < MAX_REGRESSIONS)
      this.regressions.push({ sessionId, view, asOfSeq: asOf, previous: seen });
    this.warn(
      `views reader: view ${sessionId}/${view} went back from asOfSeq ${seen} to ${asOf}: ` +
        "a processor published from a stale state",
    );
    return seen;
  }

  private sessionMap(sessionId: string): SessionViews {
    let views = this.views.get(sessionId);
    if (views === undefined) this.views.set(sessionId, (views = new Map()));
    return views;
  }

  private dropEmpty(sessionId: string): void {
    if (this.views.get(sessionId)?.size === 0) this.views.delete(sessionId);
  }
}

/** JSON equality (object member order does not matter). */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    return a.every((item, i) => jsonEqual(item, b[i]));
  }
  if (Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const bo = b as Record<string, unknown>;
  if (ka.length !== Object.keys(bo).length) return false;
  const ao = a as Record<string, unknown>;
  return ka.every((k) => Object.prototype.hasOwnProperty.call(bo, k) && jsonEqual(ao[k], bo[k]));
}

/** `{session: {view: {asOfSeq, stateVersion, value}}}`, sorted: what `processor views` prints. */
export function viewsJson(views: Map<string, SessionViews>): Record<string, Record<string, ViewRecord>> {
  const out: Record<string, Record<string, ViewRecord>> = {};
  for (const sid of [...views.keys()].sort()) {
    const per: Record<string, ViewRecord> = {};
    for (const name of [...views.get(sid)!.keys()].sort()) per[name] = views.get(sid)!.get(name)!;
    out[sid] = per;
  }
  return out;
}
