/**
 * On a real broker (skipped unless KAFKA_BOOTSTRAP_SERVERS is set): the
 * subscriber's views equal `processor views` after real processor traffic.
 *
 * - snapshot: `processor demo` (two processors, scripted sessions, checked
 *   against the offline fold), then `readViews` of its prefix.
 * - follow: a subscriber started on empty topics, then `processor run` with
 *   small records (split unit views, several transcript pages) folds ingested
 *   sessions, one of them quarantined by a gap; the follower ends equal to
 *   `processor views`, and no change event ever shows a unit view ahead of
 *   the session's status (unit records gated by heads).
 *
 * The processor is the repository's: PROCESSOR_PYTHON (default: the
 * repository's .venv, else python3) runs `-m processor` from the repository
 * root.
 */
import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { test } from "node:test";

import { CORE_VIEWS, isTranscriptPage } from "../src/parted.js";
import { foldEquivalent } from "../src/shape.js";
import { jsonEqual, viewsJson, type SessionViews } from "../src/state.js";
import { readViews, ViewsSubscriber } from "../src/subscriber.js";

const BOOTSTRAP = process.env["KAFKA_BOOTSTRAP_SERVERS"];
const ROOT = path.resolve(__dirname, "../../../..");
const VENV = path.join(ROOT, ".venv/bin/python");
const PYTHON = process.env["PROCESSOR_PYTHON"] ?? (existsSync(VENV) ? VENV : "python3");
const skip = BOOTSTRAP
  ? false
  : "KAFKA_BOOTSTRAP_SERVERS is not set (clients/typescript/scripts/ci.sh starts a broker)";
const brokers = (BOOTSTRAP ?? "").split(",");

function processor(args: string[], env: Record<string, string> = {}): string {
  const out = spawnSync(PYTHON, ["-m", "processor", ...args, "-b", BOOTSTRAP!], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    encoding: "utf8",
    timeout: 300_000,
    maxBuffer: 256 << 20,
  });
  if (out.status !== 0) {
    throw new Error(`processor ${args.join(" ")} exited ${out.status}: ${out.error ?? ""}\n${out.stderr}`);
  }
  return out.stdout;
}

/** `processor views` of the prefix, without sessions whose views all went. */
function pythonViews(prefix: string): Record<string, unknown> {
  const doc = JSON.parse(processor(["views", "--topic-prefix", prefix])) as Record<string, object>;
  return Object.fromEntries(Object.entries(doc).filter(([, v]) => Object.keys(v).length > 0));
}

const plain = (views: Map<string, SessionViews>): unknown => JSON.parse(JSON.stringify(viewsJson(views)));

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A `warn` that keeps the reader's own reports (bad input: a failure) and prints the client's. */
function collector(): { warn: (line: string) => void; reader: string[] } {
  const reader: string[] = [];
  return {
    reader,
    warn: (line) => (line.startsWith("kafkajs:") ? console.error(line) : reader.push(line)),
  };
}

test("live: a snapshot after processor demo equals processor views", { skip, timeout: 600_000 }, async () => {
  const out = spawnSync(PYTHON, ["-m", "processor", "demo", "--sessions", "4", "-b", BOOTSTRAP!], {
    cwd: ROOT,
    encoding: "utf8",
    timeout: 300_000,
  });
  assert.equal(out.status, 0, `processor demo failed:\n${out.stderr}\n${out.stdout}`);
  const prefix = /topics (\S+)\.events\//.exec(out.stderr)?.[1];
  assert.ok(prefix, `no topic prefix in the demo's output:\n${out.stderr}`);
  const warnings = collector();
  const state = await readViews({ brokers, topicPrefix: prefix, warn: warnings.warn });
  assert.deepEqual(warnings.reader, []);
  assert.ok(state.views.size >= 4, `only ${state.views.size} sessions read`);
  const expected = pythonViews(prefix);
  assert.deepEqual(plain(state.views), expected);
  const fold = JSON.parse(processor(["views", "--topic-prefix", prefix, "--format", "fold"])) as Record<
    string,
    unknown
  >;
  const ours = Object.fromEntries([...state.views].map(([sid, views]) => [sid, foldEquivalent(views)]));
  assert.deepEqual(JSON.parse(JSON.stringify(ours)), fold);
  // a subscriber tells the snapshot once per session, when it is read
  const subscriber = new ViewsSubscriber({ brokers, topicPrefix: prefix });
  const told: string[] = [];
  subscriber.onSession((sid) => told.push(sid));
  try {
    await subscriber.start();
    assert.deepEqual(told, Object.keys(expected).sort());
  } finally {
    await subscriber.stop();
  }
});

test("live: a follower equals processor views; units never ahead of status", { skip, timeout: 600_000 }, async () => {
  const prefix = `tslive${Date.now()}`;
  const dir = mkdtempSync(path.join(tmpdir(), "processor-views-live-"));
  let member: ChildProcess | null = null;
  const warnings = collector();
  const subscriber = new ViewsSubscriber({ brokers, topicPrefix: prefix, warn: warnings.warn });
  const ahead: string[] = [];
  let events = 0;
  subscriber.onSession((sid, views) => {
    events++;
    const status = views.get("status")?.value as { lastSeq: number } | undefined;
    for (const [name, r] of views) {
      if (CORE_VIEWS.has(name) || isTranscriptPage(name)) continue;
      if (status !== undefined && r.asOfSeq > status.lastSeq) {
        ahead.push(`${sid}/${name}@${r.asOfSeq} > status ${status.lastSeq}`);
      }
    }
  });
  try {
    processor(["topics", "create", "--topic-prefix", prefix]);
    await subscriber.start();
    assert.equal(subscriber.views.size, 0);
    member = spawn(
      PYTHON,
      [
        "-m",
        "processor",
        "run",
        "-b",
        BOOTSTRAP!,
        "--topic-prefix",
        prefix,
        "--group-id",
        `${prefix}-processor`,
        "--commit-interval-ms",
        "100",
        "--log-level",
        "WARNING",
      ],
      {
        cwd: ROOT,
        stdio: "inherit",
        env: {
          ...process.env,
          PROCESSOR_STATE_DIR: dir,
          PROCESSOR_MAX_VIEW_BYTES: "400", // split unit views, several bundles
          PROCESSOR_TRANSCRIPT_PAGE_SIZE: "8",
        },
      },
    );
    const example = path.join(ROOT, "processor/examples/session.jsonl");
    const lines = readFileSync(example, "utf8").split(/(?<=\n)/);
    const gap = path.join(dir, "gap.jsonl");
    writeFileSync(gap, [...lines.slice(0, 11), ...lines.slice(12)].join("")); // seq 10 missing
    // first half, then (once folded, so the units change in later transactions) the whole
    const half = path.join(dir, "half.jsonl");
    writeFileSync(half, lines.slice(0, 40).join(""));
    const halfSeq = (JSON.parse(lines[39]!) as { seq: number }).seq;
    for (const sid of ["live-a", "live-b"]) processor(["ingest", "--topic-prefix", prefix, "--session-id", sid, half]);
    const lastSeq = (sid: string): unknown =>
      (subscriber.views.get(sid)?.get("status")?.value as { lastSeq?: number } | undefined)?.lastSeq;
    for (let i = 0; i < 240 && !(lastSeq("live-a") === halfSeq && lastSeq("live-b") === halfSeq); i++) await sleep(250);
    assert.equal(lastSeq("live-a"), halfSeq, "the first half was not folded");
    for (const sid of ["live-a", "live-b"])
      processor(["ingest", "--topic-prefix", prefix, "--session-id", sid, example]);
    processor(["ingest", "--topic-prefix", prefix, "--raw", "--session-id", "live-q", gap]);
    let expected: Record<string, unknown> = {};
    let got: unknown = null;
    for (let i = 0; i < 120; i++) {
      expected = pythonViews(prefix);
      got = plain(subscriber.views);
      const status = (sid: string): string | undefined =>
        (expected[sid] as Record<string, { value: { state: string } }> | undefined)?.["status"]?.value.state;
      if (status("live-q") === "quarantined" && status("live-a") === "ok" && status("live-b") === "ok") {
        if (jsonEqual(got, expected)) break;
      }
      await sleep(500);
    }
    assert.deepEqual(got, expected);
    assert.deepEqual(Object.keys(expected).sort(), ["live-a", "live-b", "live-q"]);
    const split = Object.values(expected).some((per) =>
      Object.keys(per as object).some((n) => isTranscriptPage(n) && n !== "transcript.0"),
    );
    assert.ok(split, "expected several transcript pages");
    assert.ok(subscriber.state.stats.splitViews > 0, "expected split unit views");
    assert.ok(events > 0, "no change events");
    assert.deepEqual(ahead, [], "a change event showed a unit view ahead of its session's status");
    assert.deepEqual(warnings.reader, []);
    const snapshot = await readViews({ brokers, topicPrefix: prefix });
    assert.deepEqual(plain(snapshot.views), expected);
  } finally {
    await subscriber.stop();
    if (member !== null && member.exitCode === null) {
      const exited = new Promise((r) => member!.once("exit", r));
      member.kill("SIGTERM");
      await Promise.race([exited, new Promise((r) => setTimeout(r, 60_000).unref())]);
      if (member.exitCode === null) member.kill("SIGKILL");
    }
    rmSync(dir, { recursive: true, force: true });
  }
});

test("live: a missing topic is one clear error", { skip, timeout: 60_000 }, async () => {
  await assert.rejects(
    readViews({ brokers, topicPrefix: `tsmissing${Date.now()}` }),
    /topic tsmissing\d+\.views does not exist \(run `processor topics create`\)/,
  );
});
