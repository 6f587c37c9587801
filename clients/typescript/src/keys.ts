/**
 * Keys of the views topic (docs/views-format.md section 3): UTF-8
 * `<sessionId>/<name>`, `#<i>` after the name for part `i >= 1`.  Held as
 * latin1 strings (one char per byte, so any key maps losslessly).
 */

export function keyOf(key: Buffer): string {
  return key.toString("latin1");
}

/** The session of a key: everything before its last `/` (null without one, or not UTF-8). */
export function keySession(key: string): string | null {
  const slash = key.lastIndexOf("/");
  if (slash < 0) return null;
  const raw = Buffer.from(key.slice(0, slash), "latin1");
  const text = raw.toString("utf8");
  return Buffer.from(text, "utf8").equals(raw) ? text : null;
}
