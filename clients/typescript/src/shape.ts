/**
 * Typed access to one session's views: the core views' shapes
 * (docs/views-format.md section 6), the whole transcript stitched from its
 * pages, and the session shaped like `processor fold` output (what
 * `processor views --format fold` prints).
 */
import { CORE_VIEWS, isTranscriptPage, transcriptPage } from "./parted.js";
import type { SessionViews, ViewRecord } from "./state.js";

/** A message as the agent runtime sent it (`role`, `content`, ...: passed through as JSON). */
export type Message = Record<string, unknown>;

export interface Quarantine {
  seq: number;
  rule: string;
  reason: string;
  offset?: number;
}

/** `status`: the session's watermark, and why it stopped when quarantined. */
export interface Status {
  state: "ok" | "quarantined";
  lastSeq: number;
  quarantine?: Quarantine;
}

/** `surface`: the seqs of the nodes the model sees, in order. */
export interface Surface {
  nodes: number[];
  replaceGeneration: number;
  contentGeneration: number;
}

/** `transcript`: the index of the `transcript.<n>` pages. */
export interface TranscriptIndex {
  total: number;
  pageSize: number;
  pages: number;
}

export interface TranscriptEntry {
  seq: number;
  message: Message;
}

/** The core views of a session, typed (each undefined until the session has it). */
export interface CoreViews {
  status: Status | undefined;
  surface: Surface | undefined;
  messages: Message[] | undefined;
  transcript: TranscriptIndex | undefined;
}

export function coreViews(views: SessionViews): CoreViews {
  return {
    status: views.get("status")?.value as Status | undefined,
    surface: views.get("surface")?.value as Surface | undefined,
    messages: views.get("messages")?.value as Message[] | undefined,
    transcript: views.get("transcript")?.value as TranscriptIndex | undefined,
  };
}

/** The views of the session's domain projection units, by unit name. */
export function unitViews(views: SessionViews): Map<string, ViewRecord> {
  const out = new Map<string, ViewRecord>();
  for (const [name, r] of views) if (!CORE_VIEWS.has(name) && !isTranscriptPage(name)) out.set(name, r);
  return out;
}

/**
 * The transcript entries (`{seq, message}`), from `transcript.<n>` pages in
 * order.  The index commits with the pages it counts, so a missing page or a
 * count mismatch means a damaged topic: it throws.
 */
export function assembleTranscript(views: SessionViews): TranscriptEntry[] {
  const index = views.get("transcript")?.value as TranscriptIndex | undefined;
  if (index === undefined) return [];
  const out: TranscriptEntry[] = [];
  for (let n = 0; n < index.pages; n++) {
    const page = views.get(transcriptPage(n));
    if (page === undefined) throw new Error(`transcript page ${n} is missing`);
    out.push(...(page.value as TranscriptEntry[]));
  }
  if (out.length !== index.total) {
    throw new Error(`transcript index says ${index.total} entries, the pages hold ${out.length}`);
  }
  return out;
}

/** A session's views shaped like `processor fold` output (without `checkpoint`). */
export function foldEquivalent(views: SessionViews): Record<string, unknown> {
  const { status, surface, messages } = coreViews(views);
  if (status === undefined) throw new Error("the session has no status view yet");
  const projections: Record<string, unknown> = {};
  for (const [name, r] of unitViews(views)) projections[name] = r.value;
  return {
    asOfSeq: status.lastSeq,
    surface,
    messages,
    transcript: assembleTranscript(views),
    projections,
    status: status.state,
  };
}
