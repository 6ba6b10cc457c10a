/**
 * The Reporter's offline behaviour: queued before the first attempt, sent in order, kept across a dead network
 * and a 503 (with its Retry-After), dropped on a 4xx, and the keys re-fetched when they expire (rotation).
 * `fetch` is injected here to script network failures the real edge only shows when Kafka and its disk are
 * down; the browser end-to-end test (tests/web) posts to the real `esa edge`.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ed25519, x25519 } from "@noble/curves/ed25519.js";
import { describe, expect, it } from "vitest";
import { concat, toHex, utf8 } from "../../src/bytes.js";
import { FileStorage } from "../../src/node.js";
import { BudgetExceeded, MemoryStorage, open, Reporter, SeededRandomness } from "../../src/index.js";
import { ENVELOPE_AD } from "../../src/seal.js";
import { loadVectors } from "./vectorCheck.js";

const spec = loadVectors().find((v) => v.case === "grr")!.spec;
const signing = new Uint8Array(32).fill(7);

function keysDocument(analyzerId: string, analyzerSeed: number): string {
  const payload = JSON.stringify({ version: 1,
    analyzer: { key_id: analyzerId, public_key: toHex(x25519.getPublicKey(new Uint8Array(32).fill(analyzerSeed))) },
    shuffler: { key_id: "s1", public_key: toHex(x25519.getPublicKey(new Uint8Array(32).fill(9))) } });
  return JSON.stringify({ payload, signature: toHex(ed25519.sign(concat(utf8("esa-keys-v1\n"), utf8(payload)), signing)),
    signing_public_key: toHex(ed25519.getPublicKey(signing)) });
}

/** A scripted edge: `mode` decides each report's answer; records what it accepted. */
function scriptedEdge() {
  const state = { mode: "ok" as "ok" | "down" | "503" | "400", accepted: [] as Uint8Array[], keysBody: keysDocument("a1", 3),
    keyFetches: 0, enrolments: 0, lastEnrolment: null as null | { public_key: string; token?: string } };
  const fetcher = (async (url: string, init?: RequestInit) => {
    const path = new URL(url, "http://edge").pathname;
    if (path === "/v1/keys") {
      state.keyFetches++;
      return new Response(state.keysBody, { status: 200, headers: { "Cache-Control": "max-age=600" } });
    }
    if (path === "/v1/enrol") {
      state.enrolments++;
      state.lastEnrolment = JSON.parse(String(init!.body));
      return new Response("{}", { status: 200 });
    }
    if (state.mode === "down") throw new TypeError("network down");
    if (state.mode === "503") return new Response("", { status: 503, headers: { "Retry-After": "7" } });
    if (state.mode === "400") return new Response("", { status: 400 });
    state.accepted.push(new Uint8Array(init!.body as Uint8Array));
    return new Response("", { status: 202 });
  }) as typeof fetch;
  return { state, fetcher };
}

describe("Reporter", () => {
  it("queues while the network is down or the edge says 503, then sends in order", async () => {
    const { state, fetcher } = scriptedEdge();
    let now = 1_764_000_000;
    const storage = new MemoryStorage();
    const reporter = await Reporter.create({ endpoint: "http://edge", specs: [spec], storage, fetch: fetcher, clock: () => now,
      rng: new SeededRandomness(1) });
    expect(state.enrolments).toBe(1);
    state.mode = "down";
    const first = await reporter.report(spec.name, "fr");
    expect(first).toMatchObject({ sent: 0, pending: 1 });
    expect(first.retryAfter).toBeGreaterThan(0);
    state.mode = "503";
    now += 3600;
    const second = await reporter.report(spec.name, "en");
    expect(second).toMatchObject({ sent: 0, pending: 2, retryAfter: 7 });
    state.mode = "ok";
    expect(await reporter.flush()).toMatchObject({ sent: 0, pending: 2 }); // still inside Retry-After
    now += 8;
    expect(await reporter.flush()).toMatchObject({ sent: 2, pending: 0 });
    expect(state.accepted).toHaveLength(2);
    const shuffler = new Uint8Array(32).fill(9);
    expect(() => open(shuffler, state.accepted[0], ENVELOPE_AD)).not.toThrow();
  });

  it("two tabs on one storage queue side by side and lose nothing", async () => {
    const { state, fetcher } = scriptedEdge();
    const storage = new MemoryStorage();
    const tab = () => Reporter.create({ endpoint: "http://edge", specs: [spec], storage, fetch: fetcher, clock: () => 1_764_000_000 });
    const [a, b] = [await tab(), await tab()];
    state.mode = "down";
    await Promise.all([a.report(spec.name, "fr"), b.report(spec.name, "en"), a.report(spec.name, "de"), b.report(spec.name, "ja")]);
    expect(await storage.keys("queue/")).toHaveLength(4);
    state.mode = "ok";
    await new Promise((resolve) => setTimeout(resolve, 10));
    const c = await tab(); // a third tab, no backoff pending, drains everything
    expect(await c.flush()).toMatchObject({ sent: 4, pending: 0 });
  });

  it("drops a report the edge refuses for good (4xx), and keeps going", async () => {
    const { state, fetcher } = scriptedEdge();
    const reporter = await Reporter.create({ endpoint: "http://edge", specs: [spec], storage: new MemoryStorage(), fetch: fetcher });
    state.mode = "400";
    expect(await reporter.report(spec.name, "fr")).toMatchObject({ sent: 0, dropped: 1, pending: 0 });
    state.mode = "ok";
    expect(await reporter.report(spec.name, "fr")).toMatchObject({ sent: 1, pending: 0 });
  });

  it("follows key rotation once the cached keys expire", async () => {
    const { state, fetcher } = scriptedEdge();
    let now = 1_764_000_000;
    const reporter = await Reporter.create({ endpoint: "http://edge", specs: [spec], storage: new MemoryStorage(), fetch: fetcher,
      clock: () => now });
    await reporter.report(spec.name, "fr");
    state.keysBody = keysDocument("a2", 4);
    now += 601;
    await reporter.report(spec.name, "fr");
    expect(state.keyFetches).toBe(2);
    const sets = state.accepted.map((body) => toHex(open(new Uint8Array(32).fill(9), body, ENVELOPE_AD)));
    expect([sets[0].includes(toHex(utf8("\x02a1"))), sets[1].includes(toHex(utf8("\x02a2")))]).toEqual([true, true]);
    expect(reporter.client(spec.name).keys.analyzerKeyId).toBe("a2");
  });

  it("asks the app's backend for an enrolment token for this device's key", async () => {
    const { state, fetcher } = scriptedEdge();
    const asked: string[] = [];
    const reporter = await Reporter.create({ endpoint: "http://edge", specs: [spec], storage: new MemoryStorage(), fetch: fetcher,
      enrolmentToken: async (key) => { asked.push(key); return `v1.token-for-${key.slice(0, 8)}`; } });
    expect(asked).toEqual([toHex(reporter.client(spec.name).publicKey)]);
    expect(state.lastEnrolment).toEqual({ public_key: asked[0], token: `v1.token-for-${asked[0].slice(0, 8)}` });
  });

  it("refuses a keys document not signed by the pinned shuffler key", async () => {
    const { fetcher } = scriptedEdge();
    await expect(Reporter.create({ endpoint: "http://edge", specs: [spec], storage: new MemoryStorage(), fetch: fetcher,
      shufflerSigningKey: toHex(ed25519.getPublicKey(new Uint8Array(32).fill(8))) })).rejects.toThrow(/not signed/);
  });

  it("keeps the device key, the budget and the queue in files under Node, and refuses past the budget", async () => {
    const dir = mkdtempSync(join(tmpdir(), "esa-web-state-"));
    try {
      const { state, fetcher } = scriptedEdge();
      const budget = { epsilonPerEpoch: 2.0, epochSeconds: 86400 };
      const make = () => Reporter.create({ endpoint: "http://edge", specs: [spec], storage: new FileStorage(dir), fetch: fetcher,
        budget, clock: () => 1_764_000_000 });
      const a = await make();
      state.mode = "down";
      await a.report(spec.name, "fr"); // grr at epsilon 1.5: fits a budget of 2
      const b = await make(); // a restarted app: same device, same ledger, the queued report still there
      expect(b.deviceId).toBe(a.deviceId);
      await expect(b.report(spec.name, "fr")).rejects.toBeInstanceOf(BudgetExceeded);
      state.mode = "ok";
      expect(await b.flush()).toMatchObject({ sent: 1, pending: 0 });
      expect(state.enrolments).toBe(1); // enrolment is remembered
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
