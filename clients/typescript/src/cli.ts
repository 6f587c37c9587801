/**
 * `node dist/src/cli.js --topic-prefix P [--bootstrap-servers B] [--follow]`:
 * the views as `processor views` prints them (JSON), or, with `--follow`,
 * one JSON line per update after the snapshot.
 */
import { parseArgs } from "node:util";

import { viewsJson } from "./state.js";
import { readViews, ViewsSubscriber } from "./subscriber.js";

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      "topic-prefix": { type: "string" },
      "bootstrap-servers": { type: "string", short: "b" },
      "schema-registry": { type: "string" },
      session: { type: "string" },
      follow: { type: "boolean", default: false },
      "cache-mb": { type: "string", default: "64" },
    },
  });
  const prefix = values["topic-prefix"];
  const bootstrap = values["bootstrap-servers"] ?? process.env["KAFKA_BOOTSTRAP_SERVERS"];
  const cacheMb = Number(values["cache-mb"]);
  if (prefix === undefined || bootstrap === undefined || !(cacheMb >= 0)) {
    process.stderr.write(
      "usage: cli.js --topic-prefix P [-b HOST:PORT (or KAFKA_BOOTSTRAP_SERVERS)] [--session ID] " +
        "[--schema-registry URL] [--cache-mb N] [--follow]\n",
    );
    return 2;
  }
  const options = {
    topicPrefix: prefix,
    brokers: bootstrap.split(","),
    cacheBytes: cacheMb * 1024 * 1024,
    ...(values.session === undefined ? {} : { session: values.session }),
    ...(values["schema-registry"] === undefined ? {} : { schemaRegistryUrl: values["schema-registry"] }),
  };
  if (!values.follow) {
    const state = await readViews(options);
    process.stdout.write(JSON.stringify(viewsJson(state.views), null, 2) + "\n");
    return 0;
  }
  const subscriber = new ViewsSubscriber(options);
  subscriber.onUpdate((u) => {
    const line =
      u.record === null
        ? { session: u.sessionId, view: u.view, removed: true }
        : { session: u.sessionId, view: u.view, ...u.record };
    process.stdout.write(JSON.stringify(line) + "\n");
  });
  process.once("SIGINT", () => void subscriber.stop().then(() => process.exit(0)));
  await subscriber.start();
  return await new Promise<number>(() => {});
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`processor-views: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
