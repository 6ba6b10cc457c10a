/**
 * Where a device keeps its state: its Ed25519 seed, its budget policy and ledger, the offline queue. A small async
 * key-value interface with a browser implementation (IndexedDB) here and a file one in `node.ts`.
 */

export interface Storage {
  get(key: string): Promise<string | null>;
  set(key: string, value: string): Promise<void>;
  delete(key: string): Promise<void>;
  keys(prefix: string): Promise<string[]>;
}

/** In memory: tests, and pages that must not persist anything (every load is then a new device). */
export class MemoryStorage implements Storage {
  private readonly map = new Map<string, string>();

  async get(key: string): Promise<string | null> {
    return this.map.get(key) ?? null;
  }

  async set(key: string, value: string): Promise<void> {
    this.map.set(key, value);
  }

  async delete(key: string): Promise<void> {
    this.map.delete(key);
  }

  async keys(prefix: string): Promise<string[]> {
    return [...this.map.keys()].filter((k) => k.startsWith(prefix)).sort();
  }
}

function request<T>(req: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

/** IndexedDB (one object store of strings): survives reloads; cleared with the site's data (a new device). */
export class IndexedDBStorage implements Storage {
  private constructor(private readonly db: IDBDatabase, private readonly store: string) {}

  static async open(name = "esa-telemetry", store = "state"): Promise<IndexedDBStorage> {
    const req = indexedDB.open(name, 1);
    req.onupgradeneeded = () => req.result.createObjectStore(store);
    return new IndexedDBStorage(await request(req), store);
  }

  private tx(mode: IDBTransactionMode): IDBObjectStore {
    return this.db.transaction(this.store, mode).objectStore(this.store);
  }

  async get(key: string): Promise<string | null> {
    const value = await request(this.tx("readonly").get(key));
    return typeof value === "string" ? value : null;
  }

  async set(key: string, value: string): Promise<void> {
    await request(this.tx("readwrite").put(value, key));
  }

  async delete(key: string): Promise<void> {
    await request(this.tx("readwrite").delete(key));
  }

  async keys(prefix: string): Promise<string[]> {
    const all = (await request(this.tx("readonly").getAllKeys())) as IDBValidKey[];
    return all.map(String).filter((k) => k.startsWith(prefix)).sort();
  }
}

/**
 * Serializes a device's read-modify-write of its budget: across tabs with the Web Locks API where the browser has
 * it, and within this JavaScript realm always (a chain of promises).
 */
export class DeviceLock {
  private tail: Promise<unknown> = Promise.resolve();

  constructor(private readonly name = "esa-telemetry-device") {}

  run<T>(work: () => Promise<T>): Promise<T> {
    const locks = (globalThis as { navigator?: { locks?: { request(name: string, cb: () => Promise<T>): Promise<T> } } })
      .navigator?.locks;
    const guarded = () => (locks ? locks.request(this.name, work) : work());
    const next = this.tail.then(guarded, guarded);
    this.tail = next.catch(() => undefined);
    return next;
  }
}
