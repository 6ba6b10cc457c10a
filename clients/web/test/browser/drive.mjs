#!/usr/bin/env node
/**
 * Drive headless Chromium (Debian's /usr/bin/chromium through playwright-core; no browser is downloaded) against
 * an edge: serve the test page and the esbuild bundle on loopback, forward /v1/* to the edge (the page and the
 * edge then share an origin, as behind one reverse proxy; only method, path, body and Content-Type are
 * forwarded), run the page's functions, print one JSON line of results.
 *
 *   node test/browser/drive.mjs CONFIG_JSON_FILE
 * CONFIG: {edge: "http://127.0.0.1:P", spec: {...}, runs: [{n, values, eventTimeMs, seedBase}], persistent:
 *          {value, eventTimeMs} | null, bench: {keys, value, count} | null, budget: {...} | null}
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, request } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const edge = new URL(config.edge);
const profile = mkdtempSync(join(tmpdir(), "esa-chromium-"));
const bundleDir = mkdtempSync(join(tmpdir(), "esa-bundle-"));

const bundle = join(bundleDir, "esa-web.min.js");
await build({ entryPoints: [join(here, "..", "..", "src", "index.ts")], bundle: true, format: "esm", minify: true,
  outfile: bundle, logLevel: "silent", target: "es2022" });

const server = createServer((req, res) => {
  if (req.url.startsWith("/v1/")) {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const headers = { "Content-Length": body.length };
      if (req.headers["content-type"]) headers["Content-Type"] = req.headers["content-type"];
      const upstream = request({ host: edge.hostname, port: edge.port, path: req.url, method: req.method, headers }, (up) => {
        res.writeHead(up.statusCode, Object.fromEntries(Object.entries(up.headers).filter(([k]) =>
          ["content-type", "cache-control", "retry-after"].includes(k))));
        up.pipe(res);
      });
      upstream.on("error", () => { res.writeHead(502); res.end(); });
      upstream.end(body);
    });
    return;
  }
  const files = { "/": ["page.html", "text/html"], "/esa-web.min.js": [bundle, "text/javascript"] };
  const file = files[req.url.split("?")[0]];
  if (!file) { res.writeHead(404); res.end(); return; }
  res.writeHead(200, { "Content-Type": file[1], "Cache-Control": "no-store" });
  res.end(readFileSync(file[0].startsWith("/") ? file[0] : join(here, file[0])));
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const origin = `http://127.0.0.1:${server.address().port}`;

const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run"],
});
const out = { runs: [], persistent: null, bench: null, browser: context.browser()?.version() ?? null };
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(0);
  const load = async () => {
    await page.goto(origin + "/");
    await page.waitForFunction(() => window.sdkReady === true, null, { timeout: 120_000 });
  };
  await load();
  out.userAgent = await page.evaluate(() => navigator.userAgent);
  for (const run of config.runs) {
    out.runs.push(await page.evaluate((args) => window.runDevices(args), { ...run, spec: config.spec, budget: config.budget }));
  }
  if (config.persistent) {
    const args = { ...config.persistent, spec: config.spec, budget: config.budget };
    const first = await page.evaluate((a) => window.persistentDevice(a), args);
    await load(); // a reload: the key and the ledger come back from IndexedDB
    const second = await page.evaluate((a) => window.persistentDevice(a), args);
    out.persistent = [first, second];
  }
  if (config.bench) out.bench = await page.evaluate((a) => window.benchEncode(a), { ...config.bench, spec: config.spec });
} finally {
  await context.close();
  server.close();
  rmSync(profile, { recursive: true, force: true });
  rmSync(bundleDir, { recursive: true, force: true });
}
process.stdout.write(JSON.stringify(out) + "\n");
