#!/usr/bin/env node
/**
 * Size and speed of the web SDK (docs/performance.md): the minified and gzipped esbuild bundle, and the median
 * time of one `Client.encode` (randomize, seal each message, sign, seal the set; production randomness) in Node,
 * per golden-vector mechanism. `node bench/encode.mjs [COUNT]`; prints one JSON object.
 */
import { readFileSync, readdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir, loadavg, cpus } from "node:os";
import { join, dirname } from "node:path";
import { gzipSync } from "node:zlib";
import { fileURLToPath, pathToFileURL } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const count = Number(process.argv[2] ?? 500);
const dir = mkdtempSync(join(tmpdir(), "esa-bench-"));
const outfile = join(dir, "esa-web.min.js");
await build({ entryPoints: [join(here, "..", "src", "index.ts")], bundle: true, format: "esm", minify: true, outfile,
  logLevel: "silent", target: "es2022" });
const code = readFileSync(outfile);
const esa = await import(pathToFileURL(outfile).href);
const vectors = join(here, "..", "..", "..", "schemas", "vectors");
const results = {};
for (const file of readdirSync(vectors).sort()) {
  const v = JSON.parse(readFileSync(join(vectors, file), "utf8"));
  const client = await esa.Client.create({ spec: v.spec, storage: new esa.MemoryStorage(), keys: {
    analyzerKeyId: v.keys.analyzer_key_id, analyzerPublicKey: esa.fromHex(v.keys.analyzer_public),
    shufflerKeyId: v.keys.shuffler_key_id, shufflerPublicKey: esa.fromHex(v.keys.shuffler_public) } });
  const value = v.events[0].input.value;
  const opts = { crowdId: v.events[0].input.crowd_id ?? null };
  for (let i = 0; i < 30; i++) await client.encode(value, opts);
  const times = [];
  const cpu0 = process.cpuUsage();
  for (let i = 0; i < count; i++) {
    const t = process.hrtime.bigint();
    await client.encode(value, opts);
    times.push(Number(process.hrtime.bigint() - t) / 1000);
  }
  const cpu = process.cpuUsage(cpu0);
  times.sort((a, b) => a - b);
  results[v.case] = { messages: v.events[0].messages.length, median_us: Math.round(times[count >> 1]),
    cpu_us_per_report: Math.round((cpu.user + cpu.system) / count) };
}
rmSync(dir, { recursive: true, force: true });
console.log(JSON.stringify({ date: new Date().toISOString(), node: process.version, cpus: cpus().length,
  load: loadavg().map((x) => x.toFixed(1)), bundle_bytes: code.length, bundle_gzip_bytes: gzipSync(code, { level: 9 }).length,
  count, results }, null, 1));
