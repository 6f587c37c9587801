/**
 * A subscriber of `<prefix>.views` on a Kafka cluster (kafkajs, read
 * committed): reads every partition from the beginning, keeps the views of
 * every session ({@link ViewsState}) and tells about changes.
 *
 * - {@link ViewsSubscriber.start} resolves once the snapshot is read: every
 *   partition up to the end offsets (last stable offsets) it had when the
 *   subscriber started.  Then it keeps following.
 * - `onSession(cb)`: `cb(sessionId, views)` once per session when the
 *   snapshot is read, then after each record that changed a session's views
 *   (a head: all its views at once), with the session's views as they are now
 *   (empty when the session's last view went).
 * - `onUpdate(cb)`: the same, one {@link ViewUpdate} per view.
 * - {@link readViews}: the snapshot alone (what `processor views` prints).
 *
 * kafkajs has no partition assignment without a consumer group: the
 * subscriber joins a group of its own (a fresh id per subscriber unless
 * `groupId` is given: never share one, each subscriber must read every
 * partition) and never commits offsets, so every start reads from the
 * beginning, as the format requires; a rejoin after a crash resumes where it
 * was.
 */
import { randomUUID } from "node:crypto";
import { EventEmitter } from "node:events";
import { Kafka, logLevel, type Consumer, type KafkaConfig } from "kafkajs";

import { registryLookup, ViewCodec } from "./codec.js";
import { registerCodecs } from "./compression.js";
import { ViewsState, type SessionViews, type StateOptions, type ViewUpdate } from "./state.js";

export interface SubscriberOptions extends Omit<StateOptions, "codec"> {
  /** Bootstrap servers, e.g. `["127.0.0.1:9092"]` (or pass `kafka`). */
  brokers?: string[];
  /** Extra kafkajs client settings (ssl, sasl, clientId...). */
  kafkaConfig?: Partial<KafkaConfig>;
  /** The topic prefix: the subscriber reads `<prefix>.views`. */
  topicPrefix?: string;
  /** The views topic itself (instead of `topicPrefix`). */
  topic?: string;
  /** Consumer group to join (offsets are never committed); default: a fresh one. */
  groupId?: string;
  /** Schema registry base URL, for Confluent-framed values. */
  schemaRegistryUrl?: string;
  /** Longest wait for the snapshot (ms, default 60000). */
  snapshotTimeoutMs?: number;
}

export type SessionListener = (sessionId: string, views: SessionViews) => void;
export type UpdateListener = (update: ViewUpdate) => void;

export class ViewsSubscriber {
  readonly state: ViewsState;
  readonly topic: string;
  private readonly kafka: Kafka;
  private readonly options: SubscriberOptions;
  private readonly events = new EventEmitter();
  private consumer: Consumer | null = null;
  private readonly warn: (line: string) => void;
  /** rejects a pending snapshot */
  private abort: (err: Error) => void = () => {};

  constructor(options: SubscriberOptions) {
    registerCodecs();
    this.options = options;
    const topic = options.topic ?? (options.topicPrefix === undefined ? undefined : `${options.topicPrefix}.views`);
    if (topic === undefined) throw new TypeError("ViewsSubscriber needs topicPrefix or topic");
    this.topic = topic;
    const brokers = options.brokers ?? options.kafkaConfig?.brokers;
    if (brokers === undefined) throw new TypeError("ViewsSubscriber needs brokers");
    const warn = (this.warn = options.warn ?? ((line: string) => console.warn(line)));
    this.kafka = new Kafka({
      clientId: "processor-views",
      logLevel: logLevel.WARN,
      logCreator: () => (entry) => {
        // an error response kafkajs retries itself (a new topic without a leader yet)
        // is not news; what it cannot retry surfaces as a rejection or a crash
        if (entry.namespace === "Connection" && entry.log.message.startsWith("Response")) return;
        warn(`kafkajs: ${entry.log.message}${entry.log["error"] ? `: ${String(entry.log["error"])}` : ""}`);
      },
      ...options.kafkaConfig,
      brokers,
    });
    const codec = new ViewCodec(
      options.schemaRegistryUrl === undefined ? undefined : registryLookup(options.schemaRegistryUrl),
    );
    this.state = new ViewsState({ ...options, codec });
  }

  /** The views of every session, as read so far. */
  get views(): Map<string, SessionViews> {
    return this.state.views;
  }

  onSession(listener: SessionListener): this {
    this.events.on("session", listener);
    return this;
  }

  onUpdate(listener: UpdateListener): this {
    this.events.on("update", listener);
    return this;
  }

  /**
   * Connect, read the snapshot (resolves then), and keep following until
   * {@link stop}.  Change events start when the snapshot is read: first one
   * `onUpdate` per view and one `onSession` per session (sessions and views
   * sorted), then every committed change.
   */
  async start(): Promise<void> {
    if (this.consumer !== null) throw new Error("subscriber already started");
    const ends = await this.endOffsets();
    const consumer = (this.consumer = this.kafka.consumer({
      groupId: this.options.groupId ?? `processor-views-${randomUUID()}`,
      readUncommitted: false,
      allowAutoTopicCreation: false,
    }));
    // next offset to read per partition (what a rejoin resumes from: no offsets are committed)
    const positions = new Map<number, string>();
    let live = false;
    let done: () => void = () => {};
    let failed: (err: Error) => void = () => {};
    const snapshot = new Promise<void>((resolve, reject) => {
      done = resolve;
      failed = reject;
    });
    const check = (): void => {
      if (live) return;
      for (const [partition, end] of ends) if (BigInt(positions.get(partition) ?? -1) < end) return;
      live = true;
      this.emitSnapshot();
      done();
    };
    consumer.on(consumer.events.END_BATCH_PROCESS, (event) => {
      const { partition, lastOffset } = event.payload;
      positions.set(partition, (BigInt(lastOffset) + 1n).toString());
      check();
    });
    consumer.on(consumer.events.GROUP_JOIN, () => {
      // a rejoin (kafkajs restarts a crashed consumer) would read from the beginning again
      for (const [partition, offset] of positions) consumer.seek({ topic: this.topic, partition, offset });
    });
    consumer.on(consumer.events.CRASH, (event) => {
      const { error, restart } = event.payload;
      this.warn(`views subscriber: ${this.topic}: consumer failed: ${error.message}${restart ? " (restarting)" : ""}`);
      if (!restart) failed(error);
    });
    this.abort = failed;
    await consumer.connect();
    await consumer.subscribe({ topic: this.topic, fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachBatch: async ({ batch, heartbeat }) => {
        for (const message of batch.messages) {
          if (message.value !== null) await this.state.codec.prepare(message.value);
          const updates = this.state.apply(message.key, message.value, `${batch.partition}@${message.offset}`);
          if (live) this.emit(updates);
        }
        await heartbeat();
      },
    });
    check();
    const timeoutMs = this.options.snapshotTimeoutMs ?? 60_000;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const behind = [...ends].filter(([p, end]) => BigInt(positions.get(p) ?? -1) < end).map(([p]) => p);
        reject(
          new Error(`${this.topic}: snapshot not read within ${timeoutMs} ms (partitions ${behind.join(", ")} behind)`),
        );
      }, timeoutMs);
    });
    try {
      await Promise.race([snapshot, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Disconnect (a pending {@link start} rejects). */
  async stop(): Promise<void> {
    this.abort(new Error(`${this.topic}: subscriber stopped`));
    const consumer = this.consumer;
    this.consumer = null;
    if (consumer !== null) await consumer.disconnect();
  }

  /**
   * Per partition, the offset after the last committed record now (partitions
   * with records only).  Retries what a just-created topic answers (no leader
   * yet) until the snapshot timeout.
   */
  private async endOffsets(): Promise<Map<number, bigint>> {
    const deadline = Date.now() + (this.options.snapshotTimeoutMs ?? 60_000);
    const admin = this.kafka.admin();
    await admin.connect();
    try {
      if (!(await admin.listTopics()).includes(this.topic)) {
        throw new Error(`topic ${this.topic} does not exist (run \`processor topics create\`)`);
      }
      for (let delay = 50; ; delay = Math.min(delay * 2, 1000)) {
        try {
          const offsets = await admin.fetchTopicOffsets(this.topic);
          const ends = new Map<number, bigint>();
          for (const p of offsets) {
            if (BigInt(p.offset) > BigInt(p.low)) ends.set(p.partition, BigInt(p.offset));
          }
          return ends;
        } catch (err) {
          const retriable = (err as { retriable?: boolean }).retriable === true;
          if (!retriable || Date.now() + delay > deadline) throw err;
          await new Promise((r) => setTimeout(r, delay));
        }
      }
    } finally {
      await admin.disconnect();
    }
  }

  private emit(updates: ViewUpdate[]): void {
    if (updates.length === 0) return;
    for (const update of updates) this.events.emit("update", update);
    const sessions = new Set(updates.map((u) => u.sessionId));
    for (const sid of sessions) this.events.emit("session", sid, this.state.views.get(sid) ?? new Map());
  }

  private emitSnapshot(): void {
    for (const sid of [...this.state.views.keys()].sort()) {
      const views = this.state.views.get(sid)!;
      for (const name of [...views.keys()].sort()) {
        this.events.emit("update", { sessionId: sid, view: name, record: views.get(name)! });
      }
      this.events.emit("session", sid, views);
    }
  }
}

/** Every committed view, by session and view name, as of now (then disconnects). */
export async function readViews(options: SubscriberOptions): Promise<ViewsState> {
  const subscriber = new ViewsSubscriber(options);
  try {
    await subscriber.start();
  } finally {
    await subscriber.stop();
  }
  return subscriber.state;
}
