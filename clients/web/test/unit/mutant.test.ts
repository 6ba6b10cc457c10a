/**
 * The golden vectors catch a one-bit mutant of the seal: the SDK is rebuilt (esbuild) with one bit of the seal's
 * HKDF domain tag flipped ("esa-seal-v1" -> "esa-seal-v0", 0x31 -> 0x30), and the very checks the SDK passes must
 * fail on every sealed step of every vector -- and on nothing upstream of the seal.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { build } from "esbuild";
import { afterAll, describe, expect, it } from "vitest";
import { clientMismatches, loadVectors, stepMismatches } from "./vectorCheck.js";

const dir = mkdtempSync(join(tmpdir(), "esa-web-mutant-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function mutantSdk(): Promise<unknown> {
  let flipped = 0;
  const outfile = join(dir, "mutant.mjs");
  await build({
    entryPoints: [join(__dirname, "..", "..", "src", "index.ts")], bundle: true, format: "esm", platform: "node", outfile,
    logLevel: "silent",
    plugins: [{
      name: "flip-one-bit-of-the-seal",
      setup(b) {
        b.onLoad({ filter: /src[\\/]seal\.ts$/ }, (args) => {
          const source = readFileSync(args.path, "utf8");
          const mutated = source.replace('utf8("esa-seal-v1")', 'utf8("esa-seal-v0")');
          if (mutated !== source) flipped++;
          return { contents: mutated, loader: "ts" };
        });
      },
    }],
  });
  expect(flipped).toBe(1);
  expect("1".charCodeAt(0) ^ "0".charCodeAt(0)).toBe(1); // one bit
  return import(pathToFileURL(outfile).href);
}

describe("a one-bit mutant of the seal", () => {
  it("fails the golden vectors at the seal, the set and the envelope, and nowhere before", async () => {
    const mutant = await mutantSdk();
    const vectors = loadVectors();
    for (const v of vectors) {
      const bad = stepMismatches(mutant, v);
      const steps = new Set(bad.map((b) => b.split("/").slice(2).join("/").replace(/ \d+$/, "")));
      expect(steps.has("seal")).toBe(true);
      expect(steps.has("associated data")).toBe(true); // the tag also heads the associated data
      expect(steps.has("envelope")).toBe(true);
      expect(steps.has("payload")).toBe(false);
      expect(steps.has("signing bytes")).toBe(false); // fed the vector's own sealed bytes: unaffected
      expect(await clientMismatches(mutant, v)).toContain(`${v.case}/0/client output`);
    }
  });
});
