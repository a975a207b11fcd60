// Type-checked (never run) usage of the public API: `npm test` runs
// `tsc --noEmit` over it, so the declarations stay usable as documented.
import { isLeaseholdError, LeaseholdError, Locks, type Lease, type LeaseInfo, type LeaderInfo, type Leadership, type MultiLease, type PermitInfo, type RwLock, type Semaphore } from 'leasehold';

export async function usage(): Promise<bigint> {
  const locks: Locks = await Locks.open('memory://');
  const maybe: Lease | null = await locks.tryAcquire('orders:42', { ttl: '30s' });
  if (maybe) await maybe.release();
  const controller = new AbortController();
  await using lease = await locks.acquire('orders:42', { ttl: 30_000, wait: '5s', signal: controller.signal });
  const key: string = lease.key;
  const token: bigint = lease.token;
  lease.signal.addEventListener('abort', () => {
    const reason = lease.signal.reason as LeaseholdError;
    console.log(reason.code === 'LEASEHOLD_LOST', reason.retryable);
  });
  const lost: boolean = lease.isLost();
  lease.check();
  const n: number = await locks.withLock('job', { ttl: '10s', wait: '1m', maxHold: '5m' }, async (held) => {
    return Number(held.token) + key.length + (lost ? 1 : 0);
  });
  // Options may be left out of every with* call.
  const noOptions: bigint = await locks.withLock('job', async (held) => held.token);
  // Narrowing a caught error without a cast.
  try {
    await locks.acquire('x', { wait: 0 });
  } catch (e) {
    if (isLeaseholdError(e) && e.code === 'LEASEHOLD_BUSY') console.log(e.retryAfterMs, noOptions);
    if (e instanceof LeaseholdError) console.log(e.retryable);
  }
  const info: LeaseInfo | null = await locks.inspect('orders:42');
  const all: LeaseInfo[] = await locks.list('orders:');
  const broke: boolean = await locks.forceRelease('orders:42');
  try {
    await locks.acquire('x', { wait: 0 });
  } catch (e) {
    const error = e as LeaseholdError;
    if (error.code === 'LEASEHOLD_TIMEOUT') console.log(error.holder, error.retryAfterMs);
  }
  // Semaphores: a permit is a Lease with its slot.
  const pool: Semaphore = locks.semaphore('pool', 3);
  const permit: Lease | null = await pool.tryAcquire({ ttl: '10s' });
  const slot: number | undefined = permit?.slot;
  await permit?.release();
  await using held = await pool.acquire({ wait: '5s', signal: controller.signal });
  const holders: PermitInfo[] = await pool.holders();
  const fromPermit: bigint = await pool.withPermit({ wait: 0 }, async (p) => p.token);
  // Several keys at once.
  const multi: MultiLease = await locks.acquireMany(['a', 'b'], { wait: '1s' });
  const tokens: Map<string, bigint> = multi.tokens;
  const keys: string[] = multi.keys;
  multi.check();
  await multi.release();
  const none: MultiLease | null = await locks.tryAcquireMany(['a', 'b']);
  const sum: number = await locks.withLocks(['a', 'b'], { ttl: '5s' }, (m) => m.keys.length + (m.isLost() ? 1 : 0));
  // Reader-writer locks.
  const table: RwLock = locks.rwLock('tables:users');
  const reader: Lease | null = await table.tryRead({ ttl: '10s' });
  await reader?.release();
  const rows: number = await table.withRead({ wait: '1s' }, async () => 3);
  const readKey: string = await table.withRead((r) => r.key);
  await table.withWrite({ wait: '5s', maxHold: '1m' }, async (w) => w.token);
  const writer: Lease = await table.write({ wait: '5s' });
  const side: string | null | undefined = (await table.holders())[0]?.side;
  await writer.release();
  console.log(rows, readKey, side, await table.tryWrite(), await table.read());
  // Elections.
  const election = locks.election('leader');
  const term: Leadership = await election.campaign('node-1', { ttl: '10s', wait: '1m' });
  term.signal.addEventListener('abort', () => console.log('no longer leader'));
  const current: LeaderInfo | null = await election.leader();
  for await (const leader of election.observe()) {
    const who: string = leader.candidate;
    const since: bigint = leader.token;
    console.log(who, since);
    break;
  }
  await term.resign();
  await locks.close();
  console.log(slot, held.key, holders.length, fromPermit, tokens.size, keys, none, sum, term.candidate, current);
  return token + BigInt(n + all.length + (info ? 1 : 0) + (broke ? 1 : 0));
}
