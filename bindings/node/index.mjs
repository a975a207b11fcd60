// ES module entry: the same classes as the CommonJS entry.
import leasehold from './index.js';

export const { Locks, Lease, MultiLease, Leadership, Semaphore, RwLock, Election, LeaseholdError, isLeaseholdError } = leasehold;
export default leasehold;
