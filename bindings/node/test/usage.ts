// Type-checked (never run) usage of the public API: `npm test` runs
// `tsc --noEmit` over it, so the declarations stay usable as documented.
import { Locks, type Lease, type LeaseholdError, type LeaseInfo } from 'leasehold';

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
  const info: LeaseInfo | null = await locks.inspect('orders:42');
  const all: LeaseInfo[] = await locks.list('orders:');
  const broke: boolean = await locks.forceRelease('orders:42');
  try {
    await locks.acquire('x', { wait: 0 });
  } catch (e) {
    const error = e as LeaseholdError;
    if (error.code === 'LEASEHOLD_TIMEOUT') console.log(error.holder, error.retryAfterMs);
  }
  await locks.close();
  return token + BigInt(n + all.length + (info ? 1 : 0) + (broke ? 1 : 0));
}
