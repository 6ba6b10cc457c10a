/** Node-only pieces: a file-backed Storage (one JSON file per key in a directory, written atomically). */
import { mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Storage } from "./storage.js";

function fileName(key: string): string {
  return encodeURIComponent(key);
}

export class FileStorage implements Storage {
  constructor(private readonly dir: string) {}

  async get(key: string): Promise<string | null> {
    try {
      return await readFile(join(this.dir, fileName(key)), "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw err;
    }
  }

  async set(key: string, value: string): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    const path = join(this.dir, fileName(key));
    const tmp = `${path}.${process.pid}.tmp`;
    await writeFile(tmp, value, { mode: 0o600 });
    await rename(tmp, path);
  }

  async delete(key: string): Promise<void> {
    await rm(join(this.dir, fileName(key)), { force: true });
  }

  async keys(prefix: string): Promise<string[]> {
    let names: string[];
    try {
      names = await readdir(this.dir);
    } catch {
      return [];
    }
    return names.filter((n) => !n.endsWith(".tmp")).map(decodeURIComponent).filter((k) => k.startsWith(prefix)).sort();
  }
}
export * from "./index.js";
