export { DECODED_CACHE_BYTES, DecodedCache } from "./cache.js";
export { CodecError, decodePayload, registryLookup, RegistryUnavailable, ViewCodec } from "./codec.js";
export type { SchemaLookup, ViewEncoding, ViewValue } from "./codec.js";
export { jsonEqual, viewsJson, ViewsState } from "./state.js";
export type { SessionViews, StateOptions, ViewRecord, ViewRegression, ViewUpdate } from "./state.js";
export { readViews, ViewsSubscriber } from "./subscriber.js";
export type { SessionListener, SubscriberOptions, UpdateListener } from "./subscriber.js";
export { assembleTranscript, coreViews, foldEquivalent, unitViews } from "./shape.js";
export type { CoreViews, Message, Quarantine, Status, Surface, TranscriptEntry, TranscriptIndex } from "./shape.js";
