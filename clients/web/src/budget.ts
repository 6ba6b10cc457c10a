/**
 * The device's budget (`transforms/device/budget.py`, `policy.py`, `accounting.py`): at most `epsilonPerEpoch`
 * of replacement-LDP loss per epoch (aligned to the Unix epoch, so daily epochs renew at 00:00 UTC), across every
 * spec the device reports on. The ledger's JSON is the Python client's `budget.json`, field for field.
 *
 * A stored epoch stays in force until its `renews_at`, whatever the clock says before it (setting the clock back
 * never renews a budget). The first budget a device is given is stored; a client with another one is refused
 * (`BudgetConflict`), as the Python client refuses a foreign budget on a shared state directory.
 */

export const TOLERANCE = 1e-9;

export interface Budget {
  epsilonPerEpoch: number;
  epochSeconds: number;
}

export interface LedgerJSON {
  format: 1;
  epoch_start: number;
  renews_at: number;
  spent: number;
  reports: number;
  counts: Record<string, number>;
}

export interface BudgetStatus {
  limit: number;
  spent: number;
  remaining: number;
  reports: number;
  epochStart: number;
  renewsAt: number;
}

export class BudgetExceeded extends Error {
  constructor(readonly cost: number, readonly status: BudgetStatus, now: number) {
    const wait = Math.max(0, Math.ceil(status.renewsAt - now));
    super(`report refused: it would cost epsilon ${cost} but ${status.spent} of the epoch's ${status.limit} is spent; `
      + `the budget renews at ${new Date(status.renewsAt * 1000).toISOString()} (in ${Math.floor(wait / 3600)}h)`);
    this.name = "BudgetExceeded";
  }
}

export class BudgetConflict extends Error {
  constructor(message: string) {
    super(message);
    this.name = "BudgetConflict";
  }
}

export function checkBudget(budget: Budget): Budget {
  const { epsilonPerEpoch: eps, epochSeconds: seconds } = budget;
  if (typeof eps !== "number" || !Number.isFinite(eps) || eps <= 0) throw new RangeError(`epsilonPerEpoch must be a finite number > 0, got ${eps}`);
  if (!Number.isInteger(seconds) || seconds < 1) throw new RangeError(`epochSeconds must be an integer >= 1, got ${seconds}`);
  return budget;
}

export function freshLedger(budget: Budget, now: number): LedgerJSON {
  const start = Math.floor(now / budget.epochSeconds) * budget.epochSeconds;
  return { format: 1, epoch_start: start, renews_at: start + budget.epochSeconds, spent: 0, reports: 0, counts: {} };
}

/** The ledger in force at `now`: the stored one until its `renews_at`, else a fresh epoch. */
export function ledgerInForce(stored: string | null, budget: Budget, now: number): LedgerJSON {
  if (stored === null) return freshLedger(budget, now);
  const raw = JSON.parse(stored) as LedgerJSON;
  if (raw.format !== 1 || !(raw.renews_at > raw.epoch_start) || !(raw.spent >= 0)) throw new Error("malformed budget ledger in the device's storage");
  return now < raw.renews_at ? raw : freshLedger(budget, now);
}

export function fits(ledger: LedgerJSON, cost: number, limit: number): boolean {
  return ledger.spent + cost <= limit * (1 + TOLERANCE);
}

export function charge(ledger: LedgerJSON, cost: number, countKey: string | null): void {
  ledger.spent += cost;
  ledger.reports += 1;
  if (countKey !== null) ledger.counts[countKey] = (ledger.counts[countKey] ?? 0) + 1;
}

export function status(ledger: LedgerJSON, limit: number): BudgetStatus {
  return { limit, spent: ledger.spent, remaining: Math.max(0, limit - ledger.spent), reports: ledger.reports,
    epochStart: ledger.epoch_start, renewsAt: ledger.renews_at };
}
