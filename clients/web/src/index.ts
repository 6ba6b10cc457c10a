/** esa-telemetry's device SDK for the web. See docs/sdk-web.md. */
export { Client, deviceIdOf, loadDeviceKey, type ClientOptions, type EncodeOptions, type SealingKeys } from "./client.js";
export { Reporter, readKeysDocument, KeysDocumentError, type ReporterOptions, type FlushResult } from "./edge.js";
export { BudgetConflict, BudgetExceeded, type Budget, type BudgetStatus } from "./budget.js";
export { loadSpec, domainIndex, type ExportedSpec } from "./spec.js";
export { MemoryStorage, IndexedDBStorage, DeviceLock, type Storage } from "./storage.js";
export { CryptoRandomness, ReplayRandomness, SeededRandomness, type Randomness, type Draw } from "./random.js";
export { randomize, PRESENCE, type Message, type Payload } from "./mechanisms/index.js";
export { backstopBits, fragmentsFromBackstop, fragmentReportCost, type FragmentsSpec } from "./mechanisms/fragments.js";
export { encodePayload } from "./payload.js";
export { associatedData, seal, sealEnvelope, open } from "./seal.js";
export { signingBytes, encodeMessageSet, signMessageSet, type MessageSet } from "./messageSet.js";
export { fromHex, toHex } from "./bytes.js";
