/**
 * The parted core views (formats 2 and 3, docs/views-format.md sections 5.3
 * and 6): the newest `~` record of each name per session, and the assembly of
 * `messages`, `surface`, `status`, `transcript` and its pages on a head.
 */
import { DecodedCache } from "./cache.js";
import type { ViewValue } from "./codec.js";

export const VIEW_HEAD = "~h";
/** `f` of the newest head format this reader assembles. */
export const VIEWS_FORMAT = 3;
/** Items of a closed node or transcript chunk. */
export const CHUNK_ITEMS = 16;
/** `stateVersion` of the core views. */
export const CORE_STATE_VERSION = -1;
export const CORE_VIEWS: ReadonlySet<string> = new Set(["messages", "surface", "transcript", "status"]);
export const TRANSCRIPT_PAGE_PREFIX = "transcript.";

export const contentView = (seq: number, generation?: number): string =>
  generation === undefined ? `~m${seq}` : `~m${seq}.${generation}`;
export const nodeChunkView = (i: number): string => `~n${i}`;
export const transcriptChunkView = (i: number): string => `~t${i}`;
export const transcriptPage = (n: number): string => `${TRANSCRIPT_PAGE_PREFIX}${n}`;
export const isInternalView = (name: string): boolean => name.startsWith("~");
export const isTranscriptPage = (name: string): boolean => name.startsWith(TRANSCRIPT_PAGE_PREFIX);
const isBundle = (name: string): boolean => name.startsWith("~b");

/** A head names a record the reader does not hold (at that version). */
class Incomplete extends Error {}

/** What a head assembled, or why not. */
export type HeadResult = { assembled: true; views: Map<string, unknown> } | { assembled: false; reason: string };

/** The newest parted records of one session, and what was assembled last. */
export class SessionParts {
  readonly records = new Map<string, ViewValue>();
  /** transcript total of the last assembled head */
  total: number | null = null;
  /** message name (`~m<seq>[.<g>]`) -> [bundle holding it, position] */
  private readonly index = new Map<string, [string, number]>();
  private readonly members = new Map<string, string[]>();

  constructor(
    readonly sessionId: string,
    private readonly cache: DecodedCache,
    private readonly warn: (line: string) => void,
  ) {}

  put(record: ViewValue): void {
    this.drop(record.view);
    this.records.set(record.view, record);
    if (isBundle(record.view)) this.indexBundle(record);
  }

  drop(name: string): void {
    if (!this.records.delete(name)) return;
    this.cache.drop(this.sessionId, name);
    for (const entry of this.members.get(name) ?? []) {
      if (this.index.get(entry)?.[0] === name) this.index.delete(entry);
    }
    this.members.delete(name);
  }

  clear(): void {
    for (const name of this.records.keys()) this.cache.drop(this.sessionId, name);
    this.records.clear();
    this.index.clear();
    this.members.clear();
  }

  /** The decoded value of `name` (from its record or a bundle), at `version` if given. */
  value(name: string, version?: number): unknown {
    const record = this.records.get(name);
    if (record === undefined) {
      const hit = this.index.get(name);
      if (hit === undefined || version !== undefined) throw new Incomplete(name);
      const items = this.cache.get(this.sessionId, hit[0], this.records.get(hit[0])!) as unknown[][];
      const entry = items[hit[1]]!;
      return entry[entry.length - 1];
    }
    if (version !== undefined && record.asOfSeq !== version) throw new Incomplete(`${name}@${version}`);
    return this.cache.get(this.sessionId, name, record);
  }

  has(name: string): boolean {
    return this.records.has(name) || this.index.has(name);
  }

  /** List the entries of a bundle (one that does not decode lists none, and is reported). */
  private indexBundle(record: ViewValue): void {
    let names: string[];
    try {
      const items = this.cache.get(this.sessionId, record.view, record);
      if (!Array.isArray(items)) throw new Error("not a JSON array");
      names = items.map(
        (e: unknown) =>
          Array.isArray(e) && e.length === 2
            ? contentView(toInt(e[0]))
            : Array.isArray(e) && e.length === 3
              ? contentView(toInt(e[0]), toInt(e[1]))
              : "", // entries of other lengths: ignored
      );
    } catch (err) {
      this.warn(`views reader: unreadable bundle ${this.sessionId}/${record.view}: ${String(err)}`);
      return;
    }
    this.members.set(record.view, names);
    names.forEach((name, i) => {
      if (name) this.index.set(name, [record.view, i]);
    });
  }
}

function toInt(v: unknown): number {
  if (typeof v !== "number" || !Number.isInteger(v)) throw new Error(`not an integer: ${JSON.stringify(v)}`);
  return v;
}

/**
 * The core views a complete `head` describes (changed pages only).
 *
 * Pages before the page of the last assembled total are unchanged (the
 * transcript only grows), so they are not rebuilt.
 */
export function assemble(parts: SessionParts, head: ViewValue, h: Record<string, unknown>): HeadResult {
  const format = h["f"] === undefined ? 2 : Number(h["f"]);
  if (format > VIEWS_FORMAT) {
    return { assembled: false, reason: `head of format ${format} is newer than ${VIEWS_FORMAT}` };
  }
  const views = new Map<string, unknown>();
  let nodes: number[];
  let messages: unknown[];
  let total: number;
  let pageSize: number;
  try {
    const refs: unknown[] = [];
    (h["nc"] as number[]).forEach((age, i) => {
      refs.push(...(parts.value(nodeChunkView(i), head.asOfSeq - age) as unknown[]));
    });
    refs.push(...(h["nt"] as unknown[]));
    nodes = [];
    messages = [];
    for (const ref of refs) {
      if (typeof ref === "number") {
        nodes.push(ref);
        messages.push(parts.value(contentView(ref)));
      } else {
        const r = ref as number[];
        nodes.push(r[0]!);
        if (r.length === 2) messages.push(parts.value(contentView(r[0]!, r[1]!)));
      }
    }
    const base = Number(h["tb"] ?? 0);
    total = Number(h["tn"]);
    pageSize = Number(h["ps"]);
    const seqs: number[] = [];
    const chunks = Math.floor((total - base) / CHUNK_ITEMS);
    for (let i = 0; i < chunks; i++) seqs.push(...(parts.value(transcriptChunkView(i)) as number[]));
    seqs.push(...(h["tt"] as number[]));
    if (seqs.length !== total - base) {
      throw new Incomplete(`transcript holds ${seqs.length} of ${total - base} seqs`);
    }
    for (const seq of seqs) if (!parts.has(contentView(seq))) throw new Incomplete(contentView(seq));
    const previous = parts.total !== null && parts.total <= total ? parts.total : 0;
    const firstPage = Math.floor(Math.max(previous, base) / pageSize);
    const pages = Math.ceil(total / pageSize);
    for (let page = firstPage; page < pages; page++) {
      const start = page * pageSize;
      const stop = Math.min((page + 1) * pageSize, total);
      views.set(
        transcriptPage(page),
        seqs.slice(start - base, stop - base).map((s) => ({ seq: s, message: parts.value(contentView(s)) })),
      );
    }
  } catch (err) {
    if (err instanceof Incomplete) return { assembled: false, reason: `missing ${err.message}` };
    return { assembled: false, reason: `unreadable head or record: ${String(err)}` };
  }
  const status: Record<string, unknown> =
    "q" in h
      ? { state: "quarantined", lastSeq: head.asOfSeq, quarantine: h["q"] }
      : { state: "ok", lastSeq: head.asOfSeq };
  views.set("messages", messages);
  views.set("surface", { nodes, replaceGeneration: h["rg"], contentGeneration: h["cg"] });
  views.set("transcript", { total, pageSize, pages: Math.ceil(total / pageSize) });
  views.set("status", status);
  parts.total = total;
  return { assembled: true, views };
}
