/**
 * The device's HTTP side against `esa edge`: enrol once, fetch the shuffler-signed keys and follow their rotation,
 * post reports from a durable offline queue with exponential backoff (Retry-After honoured).
 *
 * Endpoints: `POST /v1/enrol` {public_key: hex, token?}; `GET /v1/keys` {payload: JSON text, signature: hex,
 * signing_public_key: hex}, the signature over "esa-keys-v1\n" + payload; `POST /v1/reports` with the sealed set
 * as `application/octet-stream`, 202 once it is in Kafka or on the edge's disk.
 *
 * A report is queued (stored) before the first attempt, so a closed tab or a dead network loses nothing that
 * was encoded: its budget is already spent, and the report is sent on a later flush. A 4xx other than 408/429
 * means the edge will never take these bytes; the report is dropped and counted, not retried forever.
 */
import { ed25519 } from "@noble/curves/ed25519.js";
import type { Budget } from "./budget.js";
import { concat, fromBase64, fromHex, toBase64, toHex, utf8 } from "./bytes.js";
import { Client, type EncodeOptions, loadDeviceKey, type SealingKeys } from "./client.js";
import { CryptoRandomness, type Randomness } from "./random.js";
import { type ExportedSpec, loadSpec } from "./spec.js";
import { DeviceLock, type Storage } from "./storage.js";

export const KEYS_SIGNATURE_TAG = utf8("esa-keys-v1\n");
const QUEUE = "queue/";
const KEYS_CACHE = "keys.json";
const ENROLLED = "enrolled";
const SIGNER_PIN = "shuffler_signing_key";

export class KeysDocumentError extends Error {}

/** The current keys of a `GET /v1/keys` body once its signature verifies under `pinned` (hex) or, on first use, the key it names. */
export function readKeysDocument(body: string, pinned: string | null): { keys: SealingKeys; signer: string } {
  let outer: { payload: string; signature: string; signing_public_key: string };
  try {
    outer = JSON.parse(body);
  } catch {
    throw new KeysDocumentError("keys document is not JSON");
  }
  const signer = pinned ?? outer.signing_public_key;
  if (typeof outer.payload !== "string" || typeof signer !== "string") throw new KeysDocumentError("malformed keys document");
  if (!ed25519.verify(fromHex(outer.signature), concat(KEYS_SIGNATURE_TAG, utf8(outer.payload)), fromHex(signer))) {
    throw new KeysDocumentError("the keys document is not signed by the shuffler's key");
  }
  const doc = JSON.parse(outer.payload);
  if (doc.version !== 1) throw new KeysDocumentError(`unsupported keys document version ${doc.version}`);
  return {
    keys: { analyzerKeyId: doc.analyzer.key_id, analyzerPublicKey: fromHex(doc.analyzer.public_key),
      shufflerKeyId: doc.shuffler.key_id, shufflerPublicKey: fromHex(doc.shuffler.public_key) },
    signer,
  };
}

export interface ReporterOptions {
  /** Base URL of the edge ("" for the page's own origin, e.g. behind the same reverse proxy). */
  endpoint: string;
  specs: (ExportedSpec | string | object)[];
  storage: Storage;
  budget?: Budget | null;
  /** The enrolment token the app's backend mints for this device's public key (`--enrolment token`): the token,
   * or a function from the public key (64 hex digits) to it, called once, at enrolment. None for `--enrolment open`. */
  enrolmentToken?: string | ((publicKeyHex: string) => Promise<string>);
  /** The shuffler's Ed25519 signing key (hex), shipped with the app; without it the first key seen is pinned. */
  shufflerSigningKey?: string;
  /** How long fetched keys are used before they are fetched again (default 3600 s, or the edge's max-age). */
  keysMaxAgeSeconds?: number;
  /** Most reports kept while offline; the oldest are dropped beyond it (default 1000). */
  maxQueue?: number;
  fetch?: typeof fetch;
  rng?: Randomness;
  clock?: () => number;
}

export interface FlushResult {
  sent: number;
  dropped: number;
  pending: number;
  /** Seconds to wait before the next attempt (0: the queue is empty or may be flushed now). */
  retryAfter: number;
}

export class Reporter {
  private clients = new Map<string, Client>();
  private keysFetchedAt = 0;
  private maxAge: number;
  private failures = 0;
  private nextAttempt = 0;
  private seq = 0;
  private readonly unique = new CryptoRandomness();
  private timer: ReturnType<typeof setTimeout> | null = null;
  private flushing: Promise<FlushResult> | null = null;
  readonly lock = new DeviceLock();
  dropped = 0;

  private constructor(private readonly options: ReporterOptions, private readonly fetcher: typeof fetch,
                      private readonly clock: () => number) {
    this.maxAge = options.keysMaxAgeSeconds ?? 3600;
  }

  /** Enrol (once per device), fetch the keys, and build one client per spec. Needs the network once. */
  static async create(options: ReporterOptions): Promise<Reporter> {
    const fetcher = options.fetch ?? globalThis.fetch.bind(globalThis);
    const reporter = new Reporter(options, fetcher, options.clock ?? (() => Date.now() / 1000));
    const seed = await loadDeviceKey(options.storage, options.rng);
    const keys = await reporter.fetchKeys();
    for (const raw of options.specs) {
      const spec = loadSpec(raw);
      const client = await Client.create({ spec, storage: options.storage, keys, budget: options.budget ?? null,
        rng: options.rng, clock: options.clock, lock: reporter.lock, deviceSeed: seed });
      reporter.clients.set(spec.spec_id, client);
      reporter.clients.set(spec.name, client);
    }
    const first = reporter.clients.values().next().value as Client | undefined;
    if (first) await reporter.enrol(first.publicKey);
    return reporter;
  }

  get deviceId(): string {
    const first = this.clients.values().next().value as Client | undefined;
    if (!first) throw new Error("no spec");
    return first.deviceId;
  }

  client(spec: string): Client {
    const c = this.clients.get(spec);
    if (!c) throw new Error(`no spec named ${spec} (known: ${[...new Set([...this.clients.values()].map((x) => x.spec.name))].join(", ")})`);
    return c;
  }

  private url(path: string): string {
    return this.options.endpoint.replace(/\/$/, "") + path;
  }

  private async enrol(publicKey: Uint8Array): Promise<void> {
    const hex = toHex(publicKey);
    if ((await this.options.storage.get(ENROLLED)) === hex) return;
    const given = this.options.enrolmentToken;
    const token = typeof given === "function" ? await given(hex) : given;
    const body = JSON.stringify({ public_key: hex, ...(token ? { token } : {}) });
    const answer = await this.fetcher(this.url("/v1/enrol"), { method: "POST", body, headers: { "Content-Type": "application/json" } });
    if (answer.status >= 300) throw new Error(`enrolment refused: ${answer.status} ${await answer.text()}`);
    await this.options.storage.set(ENROLLED, hex);
  }

  /** The current keys: cached until they are `maxAge` old, then fetched and verified again (rotation). */
  async fetchKeys(force = false): Promise<SealingKeys> {
    const storage = this.options.storage;
    const cached = await storage.get(KEYS_CACHE);
    const now = this.clock();
    if (cached && !force) {
      const c = JSON.parse(cached) as { at: number; max_age: number; body: string };
      if (now - c.at < c.max_age) {
        this.keysFetchedAt = c.at;
        return readKeysDocument(c.body, await storage.get(SIGNER_PIN)).keys;
      }
    }
    const answer = await this.fetcher(this.url("/v1/keys"), { method: "GET" });
    if (answer.status !== 200) throw new Error(`GET /v1/keys answered ${answer.status}`);
    const body = await answer.text();
    const pinned = this.options.shufflerSigningKey ?? (await storage.get(SIGNER_PIN));
    const { keys, signer } = readKeysDocument(body, pinned);
    if (pinned === null) await storage.set(SIGNER_PIN, signer);
    const maxAge = /max-age=(\d+)/.exec(answer.headers.get("Cache-Control") ?? "");
    this.maxAge = this.options.keysMaxAgeSeconds ?? (maxAge ? Number(maxAge[1]) : 3600);
    await storage.set(KEYS_CACHE, JSON.stringify({ at: now, max_age: this.maxAge, body }));
    this.keysFetchedAt = now;
    for (const client of this.clients.values()) client.keys = keys;
    return keys;
  }

  /** Encode one value of `spec` (name or spec id), queue it durably, and try to send the queue. */
  async report(spec: string, value: unknown, options: EncodeOptions = {}): Promise<FlushResult> {
    if (this.clock() - this.keysFetchedAt >= this.maxAge) {
      try {
        await this.fetchKeys();
      } catch {
        // offline: keep sealing to the keys in hand (the analyzer and shuffler keep old private keys)
      }
    }
    const body = await this.client(spec).encode(value, options);
    await this.enqueue(body);
    return this.flush();
  }

  /** Encode without sending (the caller posts the bytes itself). */
  encode(spec: string, value: unknown, options: EncodeOptions = {}): Promise<Uint8Array> {
    return this.client(spec).encode(value, options);
  }

  async enqueue(body: Uint8Array): Promise<void> {
    const storage = this.options.storage;
    // time, then a counter, then random bits: tabs sharing one IndexedDB never overwrite each other's reports,
    // and the queue drains in about the order the reports were made
    const key = `${QUEUE}${String(Math.floor(this.clock() * 1000)).padStart(15, "0")}-${String(this.seq++ % 1e6).padStart(6, "0")}`
      + `-${toHex(this.unique.bytes(4))}`;
    await storage.set(key, toBase64(body));
    const queued = await storage.keys(QUEUE);
    const excess = queued.length - (this.options.maxQueue ?? 1000);
    for (let i = 0; i < excess; i++) {
      await storage.delete(queued[i]);
      this.dropped++;
    }
  }

  /** Post queued reports in order until the queue is empty or the edge (or the network) says wait. */
  flush(): Promise<FlushResult> {
    if (!this.flushing) this.flushing = this.drain().finally(() => { this.flushing = null; });
    return this.flushing;
  }

  private async drain(): Promise<FlushResult> {
    const storage = this.options.storage;
    let sent = 0;
    const dropped = this.dropped;
    const wait = Math.max(0, this.nextAttempt - this.clock());
    if (wait > 0) return { sent, dropped: 0, pending: (await storage.keys(QUEUE)).length, retryAfter: wait };
    for (const key of await storage.keys(QUEUE)) {
      const stored = await storage.get(key);
      if (stored === null) continue;
      let answer: Response;
      try {
        answer = await this.fetcher(this.url("/v1/reports"), { method: "POST", body: fromBase64(stored) as Uint8Array<ArrayBuffer>,
          headers: { "Content-Type": "application/octet-stream" } });
      } catch {
        return this.backoff(sent, dropped, null);
      }
      if (answer.status === 202 || answer.status === 200) {
        await storage.delete(key);
        sent++;
        this.failures = 0;
        continue;
      }
      if (answer.status === 408 || answer.status === 429 || answer.status >= 500) {
        const retry = Number(answer.headers.get("Retry-After"));
        return this.backoff(sent, dropped, Number.isFinite(retry) && retry > 0 ? retry : null);
      }
      await storage.delete(key); // a 4xx: these bytes will never be accepted
      this.dropped++;
    }
    return { sent, dropped: this.dropped - dropped, pending: 0, retryAfter: 0 };
  }

  private async backoff(sent: number, dropped: number, retryAfter: number | null): Promise<FlushResult> {
    this.failures++;
    const exponential = Math.min(300, 2 ** Math.min(this.failures, 9)) * (0.5 + Math.random() / 2);
    const wait = retryAfter ?? exponential;
    this.nextAttempt = this.clock() + wait;
    return { sent, dropped: this.dropped - dropped, pending: (await this.options.storage.keys(QUEUE)).length, retryAfter: wait };
  }

  /** Flush now and then whenever the backoff allows, until `stop()`; also when the browser comes back online. */
  start(): void {
    const tick = async () => {
      const result = await this.flush().catch(() => ({ retryAfter: 30, pending: 1 }) as FlushResult);
      if (this.timer !== null || result.pending > 0) this.timer = setTimeout(tick, Math.max(1, result.retryAfter) * 1000);
    };
    this.timer = setTimeout(tick, 0);
    const w = globalThis as { addEventListener?: (name: string, f: () => void) => void };
    w.addEventListener?.("online", () => { this.nextAttempt = 0; void this.flush(); });
  }

  stop(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }
}
