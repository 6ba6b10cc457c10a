/**
 * `Client`: one device reporting values of one spec -- randomize, charge the budget, seal each message to the
 * analyzer, sign the set, seal the set to the shuffler -- byte for byte what `transforms/device/client.py` sends.
 *
 * As in Python, `encode` checks the budget and draws the report's randomness under the device lock, stores the
 * new spend, and only then seals and signs: a crash after the spend is stored loses that budget but can never
 * exceed it. Draw order (what the golden vectors pin): the randomizer's coins, one 32-byte ephemeral key per
 * message, the 16-byte nonce, the envelope's ephemeral key.
 */
import { ed25519 } from "@noble/curves/ed25519.js";
import { sha256 } from "@noble/hashes/sha2.js";
import {
  type Budget, BudgetConflict, BudgetExceeded, type BudgetStatus, charge, checkBudget, fits, ledgerInForce, status,
} from "./budget.js";
import { concat, fromHex, toHex, utf8 } from "./bytes.js";
import { backstopBits, fragmentReportCost, fragmentsFromBackstop, type FragmentsSpec } from "./mechanisms/fragments.js";
import { type Message, randomize } from "./mechanisms/index.js";
import { encodeMessageSet, type MessageSet, NONCE_BYTES, signMessageSet } from "./messageSet.js";
import { encodePayload } from "./payload.js";
import { CryptoRandomness, type Randomness } from "./random.js";
import { associatedData, seal, sealEnvelope } from "./seal.js";
import { domainIndex, type ExportedSpec, loadSpec } from "./spec.js";
import { DeviceLock, type Storage } from "./storage.js";

export const DEVICE_KEY = "device_key";
export const BUDGET_KEY = "budget.json";
export const POLICY_KEY = "budget_policy.json";
const MAX_TIME_MS = 2 ** 53;

/** The keys a device seals to (from `GET /v1/keys`, or pinned by the app). */
export interface SealingKeys {
  analyzerKeyId: string;
  analyzerPublicKey: Uint8Array;
  shufflerKeyId: string;
  shufflerPublicKey: Uint8Array;
}

/** Self-certifying device id: the first 16 bytes of SHA-256("esa-device-v1" || public key), as hex. */
export function deviceIdOf(publicKey: Uint8Array): string {
  return toHex(sha256(concat(utf8("esa-device-v1"), publicKey)).subarray(0, 16));
}

/** The device's Ed25519 seed: the stored one, else a fresh one from the CSPRNG, stored before it is used. */
export async function loadDeviceKey(storage: Storage, rng: Randomness = new CryptoRandomness()): Promise<Uint8Array> {
  const stored = await storage.get(DEVICE_KEY);
  if (stored !== null) {
    const seed = fromHex(stored);
    if (seed.length !== 32) throw new Error("corrupt device key in storage");
    return seed;
  }
  const seed = rng.bytes(32);
  await storage.set(DEVICE_KEY, toHex(seed));
  return seed;
}

export interface ClientOptions {
  spec: ExportedSpec | string | object;
  storage: Storage;
  keys: SealingKeys;
  /** The device's budget; the first one given is stored and every later client must pass the same. */
  budget?: Budget | null;
  /** Tests and simulations only: replayed or seeded draws. Default: crypto.getRandomValues. */
  rng?: Randomness;
  /** Seconds since the Unix epoch (default Date.now() / 1000): decides the budget epoch and the default event time. */
  clock?: () => number;
  /** Shared by the clients of one device (one per spec) so their budget updates never interleave. */
  lock?: DeviceLock;
  /** The device seed (default: `loadDeviceKey(storage)`). */
  deviceSeed?: Uint8Array;
}

export interface EncodeOptions {
  eventTimeMs?: number;
  crowdId?: string | null;
}

export class Client {
  readonly spec: ExportedSpec;
  readonly publicKey: Uint8Array;
  readonly deviceId: string;
  keys: SealingKeys;
  private readonly storage: Storage;
  private readonly budget: Budget | null;
  private readonly rng: Randomness;
  private readonly clock: () => number;
  private readonly lock: DeviceLock;
  private readonly seed: Uint8Array;

  private constructor(options: ClientOptions, seed: Uint8Array) {
    this.spec = loadSpec(options.spec);
    this.storage = options.storage;
    this.budget = options.budget ? checkBudget(options.budget) : null;
    this.rng = options.rng ?? new CryptoRandomness();
    this.clock = options.clock ?? (() => Date.now() / 1000);
    this.lock = options.lock ?? new DeviceLock();
    this.keys = options.keys;
    this.seed = seed;
    this.publicKey = ed25519.getPublicKey(seed);
    this.deviceId = deviceIdOf(this.publicKey);
  }

  static async create(options: ClientOptions): Promise<Client> {
    const seed = options.deviceSeed ?? (await loadDeviceKey(options.storage));
    const client = new Client(options, seed);
    await client.lock.run(() => client.checkPolicy());
    return client;
  }

  /** The stored budget must be this client's (stored now if the device has none). */
  private async checkPolicy(): Promise<Budget | null> {
    const raw = await this.storage.get(POLICY_KEY);
    if (raw === null) {
      if (this.budget !== null) {
        await this.storage.set(POLICY_KEY, JSON.stringify({ format: 1, epsilon_per_epoch: this.budget.epsilonPerEpoch,
          epoch_seconds: this.budget.epochSeconds, set_at: Math.floor(this.clock()) }));
      }
      return this.budget;
    }
    const stored = JSON.parse(raw) as { epsilon_per_epoch: number; epoch_seconds: number };
    if (this.budget === null || stored.epsilon_per_epoch !== this.budget.epsilonPerEpoch
        || stored.epoch_seconds !== this.budget.epochSeconds) {
      throw new BudgetConflict(`this device's budget is epsilon ${stored.epsilon_per_epoch} per ${stored.epoch_seconds} s; `
        + `a client with ${this.budget ? `epsilon ${this.budget.epsilonPerEpoch} per ${this.budget.epochSeconds} s` : "no budget"} is refused`);
    }
    return this.budget;
  }

  /** The signed message set of one event sealed to the shuffler: the body of `POST /v1/reports`. */
  async encode(value: unknown, options: EncodeOptions = {}): Promise<Uint8Array> {
    const index = domainIndex(this.spec, value);
    const crowd = this.crowd(options.crowdId ?? null);
    const now = this.clock();
    const eventTimeMs = this.eventTime(options.eventTimeMs, now);
    const memoizing = this.spec.budget.memoizing;
    const countKey = memoizing ? `${this.spec.spec_id}|${JSON.stringify(index)}` : null;
    const messages = await this.lock.run(async () => {
      const budget = await this.checkPolicy();
      let ledger = null;
      if (budget !== null) ledger = ledgerInForce(await this.storage.get(BUDGET_KEY), budget, now);
      const cost = memoizing
        ? fragmentReportCost(this.spec.mechanism as FragmentsSpec, (ledger?.counts[countKey as string] ?? 0) + 1)
        : this.spec.budget.epsilon_per_report;
      if (ledger !== null && budget !== null && !fits(ledger, cost, budget.epsilonPerEpoch)) {
        throw new BudgetExceeded(cost, status(ledger, budget.epsilonPerEpoch), now);
      }
      const out = memoizing ? await this.memoized(index) : randomize(this.spec, index, this.rng);
      if (ledger !== null) {
        charge(ledger, cost, countKey);
        await this.storage.set(BUDGET_KEY, JSON.stringify(ledger));
      }
      return out;
    });
    return this.sealAndSign(messages, eventTimeMs, crowd);
  }

  /**
   * A report of a memoizing mechanism: fresh fragments of the value's permanent backstop, drawn the first time the
   * value is reported and stored before any report uses it (transforms/device/memo.py's store, same JSON, keyed by
   * the metric and the backstop's parameters, so a spec edit that keeps them keeps the backstops).
   */
  private async memoized(index: number): Promise<Message[]> {
    const m = this.spec.mechanism as FragmentsSpec;
    const identity = this.spec.budget.identity as string;
    const key = `memo/${toHex(sha256(utf8(identity))).slice(0, 24)}.json`;
    const raw = await this.storage.get(key);
    const store = raw === null ? { format: 2, identity, backstops: {} as Record<string, number[]> } : JSON.parse(raw);
    if (store.format !== 2 || store.identity !== identity) throw new Error(`${key}: not the memo store of ${identity}`);
    const valueKey = JSON.stringify(index);
    let bits: number[] | undefined = store.backstops[valueKey];
    if (bits === undefined) {
      bits = backstopBits(m, index, this.rng);
      store.backstops[valueKey] = bits;
      await this.storage.set(key, JSON.stringify(store));
    }
    return fragmentsFromBackstop(m, bits, this.rng);
  }

  /** How many values of this spec have a stored permanent randomization on this device. */
  async memoizedValues(): Promise<number> {
    if (!this.spec.budget.memoizing) return 0;
    const raw = await this.storage.get(`memo/${toHex(sha256(utf8(this.spec.budget.identity as string))).slice(0, 24)}.json`);
    return raw === null ? 0 : Object.keys(JSON.parse(raw).backstops).length;
  }

  /** Spent and remaining budget of the current epoch (limit Infinity without a budget). */
  async status(): Promise<BudgetStatus> {
    const now = this.clock();
    if (this.budget === null) return { limit: Infinity, spent: 0, remaining: Infinity, reports: 0, epochStart: Math.floor(now), renewsAt: Math.floor(now) };
    const ledger = ledgerInForce(await this.storage.get(BUDGET_KEY), this.budget, now);
    return status(ledger, this.budget.epsilonPerEpoch);
  }

  private crowd(crowdId: string | null): string | null {
    const partition = this.spec.crowd_partition;
    if (partition === null) {
      if (crowdId !== null) throw new Error(`${this.spec.name} has no crowd partition: pass no crowdId`);
      return null;
    }
    if (typeof crowdId !== "string" || crowdId.length === 0) throw new Error(`${this.spec.name} splits crowds by ${partition}: pass its value as crowdId`);
    if (crowdId.length > this.spec.max_crowd_id_length) throw new Error(`crowdId of ${crowdId.length} characters (at most ${this.spec.max_crowd_id_length})`);
    return crowdId;
  }

  private eventTime(eventTimeMs: number | undefined, now: number): number {
    if (eventTimeMs === undefined) return Math.trunc(now * 1000);
    if (!Number.isSafeInteger(eventTimeMs) || eventTimeMs < 0 || eventTimeMs >= MAX_TIME_MS) {
      throw new RangeError(`eventTimeMs must be an integer in [0, 2^53), got ${eventTimeMs}`);
    }
    return eventTimeMs;
  }

  /** Seal every message to the analyzer, sign the set, seal it to the shuffler (no lock needed). */
  sealAndSign(messages: Message[], eventTimeMs: number, crowdId: string | null): Uint8Array {
    const window = this.spec.window_seconds * 1000;
    const windowEnd = (Math.floor(eventTimeMs / window) + 1) * window;
    const ephemerals = messages.map(() => this.rng.bytes(32));
    const nonce = this.rng.bytes(NONCE_BYTES);
    const envelopeEphemeral = this.rng.bytes(32);
    const { analyzerKeyId, analyzerPublicKey, shufflerKeyId, shufflerPublicKey } = this.keys;
    const sealed = messages.map((m, i) => ({
      channel: m.channel,
      sealed: seal(analyzerPublicKey, analyzerKeyId, encodePayload(this.spec.wire, m.payload),
        associatedData(this.spec.spec_id, crowdId, windowEnd, m.channel), ephemerals[i]),
    }));
    const ms: MessageSet = { specId: this.spec.spec_id, crowdId, deviceId: this.deviceId, eventTimeMs, nonce,
      keyId: analyzerKeyId, messages: sealed };
    ms.signature = signMessageSet(ms, this.seed);
    const encoded = encodeMessageSet(ms, this.spec.wire.message_set_header, this.spec.wire.schema_version);
    return sealEnvelope(shufflerPublicKey, shufflerKeyId, encoded, envelopeEphemeral);
  }
}
