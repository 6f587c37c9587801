/**
 * Helpers over one session's views: the whole transcript stitched from its
 * pages, and the session shaped like `processor fold` output (what
 * `processor views --format fold` prints).
 */
import { CORE_VIEWS, isTranscriptPage, transcriptPage } from "./parted.js";
import type { SessionViews } from "./state.js";

/**
 * The transcript entries (`{seq, message}`), from `transcript.<n>` pages in
 * order.  The index commits with the pages it counts, so a missing page or a
 * count mismatch means a damaged topic: it throws.
 */
export function assembleTranscript(views: SessionViews): unknown[] {
  const index = views.get("transcript")?.value as { total: number; pages: number } | undefined;
  if (index === undefined) return [];
  const out: unknown[] = [];
  for (let n = 0; n < index.pages; n++) {
    const page = views.get(transcriptPage(n));
    if (page === undefined) throw new Error(`transcript page ${n} is missing`);
    out.push(...(page.value as unknown[]));
  }
  if (out.length !== index.total) {
    throw new Error(`transcript index says ${index.total} entries, the pages hold ${out.length}`);
  }
  return out;
}

/** A session's views shaped like `processor fold` output (without `checkpoint`). */
export function foldEquivalent(views: SessionViews): Record<string, unknown> {
  const status = views.get("status")?.value as { state: string; lastSeq: number } | undefined;
  if (status === undefined) throw new Error("the session has no status view yet");
  const projections: Record<string, unknown> = {};
  for (const [name, r] of views) {
    if (!CORE_VIEWS.has(name) && !isTranscriptPage(name)) projections[name] = r.value;
  }
  return {
    asOfSeq: status.lastSeq,
    surface: views.get("surface")?.value,
    messages: views.get("messages")?.value,
    transcript: assembleTranscript(views),
    projections,
    status: status.state,
  };
}
