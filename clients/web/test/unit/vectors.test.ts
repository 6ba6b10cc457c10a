import { describe, expect, it } from "vitest";
import * as sdk from "../../src/index.js";
import { clientMismatches, loadVectors, stepMismatches } from "./vectorCheck.js";

const vectors = loadVectors();

describe("golden vectors (schemas/vectors, written by python -m pipelines.golden_vectors)", () => {
  it("cover every mechanism of the web SDK", () => {
    const names = new Set(vectors.map((v) => (v.spec.mechanism.name === "dyadic_range" ? `dyadic_range/${v.spec.mechanism.oracle}` : v.spec.mechanism.name)));
    expect([...names].sort()).toEqual(["dyadic_range/grr", "dyadic_range/llh", "dyadic_range/olh", "dyadic_range/oue", "grr", "olh", "oue", "rappor_fragments"]);
  });

  for (const v of vectors) {
    it(`${v.case}: every wire step is byte-identical`, () => {
      expect(stepMismatches(sdk, v)).toEqual([]);
    });
    it(`${v.case}: the client's output and ledger are byte-identical`, async () => {
      expect(await clientMismatches(sdk, v)).toEqual([]);
    });
  }
});
