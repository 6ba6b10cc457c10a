import type { FragmentsSpec } from "./mechanisms/fragments.js";

/**
 * A spec as `esa spec-json` exports it (`transforms/device/spec_export.py`): the analysis, its randomizer with the
 * exact probabilities the Python client draws against, the wire facts and the per-report budget charge.
 */

export interface OracleSpec {
  name: "grr" | "oue" | "olh" | "llh";
  d: number;
  epsilon: number;
  p: number;
  q?: number;
  g?: number;
  seed_family?: number;
}

export interface DyadicSpec {
  name: "dyadic_range";
  bits: number;
  epsilon: number;
  levels: "sample" | "all";
  oracle: "grr" | "oue" | "olh" | "llh";
  prefix_lengths: number[];
  channels: number;
  seed_family: number;
  oue_width: number;
  level_oracles: OracleSpec[];
}

export type MechanismSpec = OracleSpec | DyadicSpec | FragmentsSpec;

export interface WireSpec {
  schema_version: number;
  payload_kind: "category" | "bits" | "hashed" | "mark";
  union_index: number;
  mark_union_index: number;
  pad_length: number;
  bit_length: number | null;
  single_message: boolean;
  message_set_header: string;
}

export interface ExportedSpec {
  format: 1;
  spec_id: string;
  name: string;
  kind: "histogram" | "range" | "quantiles";
  metric: string;
  window_seconds: number;
  crowd_partition: string | null;
  max_crowd_id_length: number;
  domain: { categories?: string[]; bits?: number; value_range?: [number, number] | null };
  mechanism: MechanismSpec;
  wire: WireSpec;
  budget: { memoizing: boolean; epsilon_per_report: number; rule: string; identity: string | null };
}

const SUPPORTED = new Set(["grr", "oue", "olh", "dyadic_range", "rappor_fragments"]);

/** Parse and sanity-check a spec export (a JSON string or an already parsed object). */
export function loadSpec(raw: string | object): ExportedSpec {
  const spec = (typeof raw === "string" ? JSON.parse(raw) : raw) as ExportedSpec;
  if (spec?.format !== 1) throw new Error(`not a spec export of format 1 (esa spec-json): format ${JSON.stringify(spec?.format)}`);
  if (!SUPPORTED.has(spec.mechanism?.name)) throw new Error(`mechanism ${spec.mechanism?.name} is not implemented by the web SDK`);
  if (typeof spec.spec_id !== "string" || !spec.spec_id.includes("@")) throw new Error("spec export without a spec_id");
  if (spec.budget.memoizing !== (spec.mechanism.name === "rappor_fragments")) throw new Error("spec export: memoizing flag does not fit the mechanism");
  return spec;
}

/** A value of the spec's domain as the category or leaf index the randomizer encodes (`transforms/wire/event_values.py`). */
export function domainIndex(spec: ExportedSpec, value: unknown): number {
  if (spec.kind === "histogram") {
    const categories = spec.domain.categories ?? [];
    if (typeof value === "string") {
      const index = categories.indexOf(value);
      if (index < 0) throw new RangeError(`category ${JSON.stringify(value)} is not in the domain of ${spec.name}`);
      return index;
    }
    if (typeof value === "number" && Number.isInteger(value)) {
      if (value < 0 || value >= categories.length) throw new RangeError(`category index ${value} outside [0, ${categories.length}) of ${spec.name}`);
      return value;
    }
    throw new TypeError(`a ${typeof value} value cannot feed histogram ${spec.name}`);
  }
  const bits = spec.domain.bits as number;
  if (typeof value !== "number") throw new TypeError(`a ${typeof value} value cannot feed ${spec.kind} analysis ${spec.name}`);
  if (!Number.isFinite(value)) throw new RangeError(`value ${value} is not finite`);
  const range = spec.domain.value_range;
  const top = 2 ** bits;
  if (range === null || range === undefined) {
    if (!Number.isInteger(value) || value < 0 || value >= top) throw new RangeError(`value ${value} is not an integer in [0, 2^${bits}) of ${spec.name}`);
    return value;
  }
  const [lo, hi] = range;
  if (!(lo <= value && value <= hi)) throw new RangeError(`value ${value} outside the value_range [${lo}, ${hi}] of ${spec.name}`);
  return Math.min(Math.trunc(((value - lo) / (hi - lo)) * top), top - 1);
}
