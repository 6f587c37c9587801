/**
 * Kafka record-batch codecs kafkajs lacks: the processor's producers write
 * LZ4 batches (`compression.type=lz4`); ZSTD covers writers configured so.
 * Both pure JavaScript (lz4js, fzstd): nothing to build.  Only decompression
 * is needed by a subscriber.
 */
import { CompressionCodecs, CompressionTypes } from "kafkajs";
import { decompress as zstdDecompress } from "fzstd";
import * as lz4 from "lz4js";

let registered = false;

function refuse(): never {
  throw new Error("processor-views only reads: compressing is not supported");
}

export function registerCodecs(): void {
  if (registered) return;
  registered = true;
  CompressionCodecs[CompressionTypes.LZ4] = () => ({
    compress: async () => refuse(),
    decompress: async (buffer: Buffer) => Buffer.from(lz4.decompress(buffer)),
  });
  CompressionCodecs[CompressionTypes.ZSTD] = () => ({
    compress: async () => refuse(),
    decompress: async (buffer: Buffer) => Buffer.from(zstdDecompress(buffer)),
  });
}
