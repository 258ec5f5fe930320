package regional

import "context"

// Pool is where a region keeps the units it took from the global store:
// per key one batch (the units of one global grant, spent until the batch
// lapses), the refill lock that lets one instance of the region at a time
// go to global for the next batch, and the last refusal of global, which
// the region repeats for a moment instead of asking again. The regional
// Redis is one (redisstore.Pool, lua/pool_spend.lua and lua/pool_fill.lua);
// MemoryPool is the same in this process, for tests and as the reference
// the scripts follow. Every method is one atomic step on one key.
//
// Times are the pool's own clock in µs (Redis TIME for the regional
// Redis); Spend reports it so the instance measures a batch's lifetime on
// the clock that will judge it.
type Pool interface {
	// Spend takes units from key's batch (PoolSpend says how many and
	// whether to claim the refill when the batch is short), or reports
	// why it could not: a refusal of global in force, a refill under way,
	// or the refill now claimed for the caller.
	Spend(ctx context.Context, key string, s PoolSpend) (Spent, error)
	// Fill installs the batch (or refusal) a refill brought back, if the
	// caller still holds key's refill lock, and releases the lock. It
	// reports the units the batch it replaced still held, which the
	// caller returns to global, or that the lock was no longer the
	// caller's (nothing was installed).
	Fill(ctx context.Context, key, token string, f PoolFill) (Filled, error)
	// Unlock releases key's refill lock if token holds it: the refill
	// failed.
	Unlock(ctx context.Context, key, token string) error
	// Back puts units back into key's batch if it is the batch named mark
	// of global's state epoch (0 naming any), has not lapsed and takes
	// units back; it reports whether it did (if not, the units go to
	// global). The epoch tells a batch granted after an admin reset from
	// one granted before it under the same mark (a grant in the same µs).
	Back(ctx context.Context, key string, units, mark int64, epoch uint64) (bool, error)
	// Drain ends key's batch named mark once it has lapsed (or at once,
	// with force): it takes the batch's units out of the pool, so the
	// caller returns them to global, and takes no give-back into the
	// batch afterwards (Back reports false), whatever clock a later Back
	// reads. The instance that drains a batch stops tracking it, so a
	// unit given back into it after its drain would reach global never.
	Drain(ctx context.Context, key string, mark int64, force bool) (Drained, error)
	// Peek reports key's batch as it stands, spending nothing.
	Peek(ctx context.Context, key string) (Spent, error)
	// Reset forgets key's batch, lock and refusal.
	Reset(ctx context.Context, key string) (bool, error)
}

// PoolSpend is one request to spend from a pool.
type PoolSpend struct {
	// Cost is the units the request needs; up to Want (>= Cost) are taken
	// when the batch has them.
	Cost, Want int64
	// Pay takes what the batch has, up to Cost, even less than Cost
	// (a charge paid first from the region's units): never claims a
	// refill.
	Pay bool
	// Token names the caller, should it claim the refill; LockFor (µs) is
	// how long its claim holds before another instance may take over.
	Token   string
	LockFor int64
	// MaxBatch is the most one batch may hold (⌈region_quota × Q⌉, or the
	// cost when larger); Life is a batch's lifetime (µs): the pool sizes
	// the next batch from them (see Spent.Want).
	MaxBatch, Life int64
}

// Outcomes of a Spend.
const (
	// SpendNone: nothing was taken (a Peek, or a Pay from an empty batch).
	SpendNone = iota
	// SpendTaken: Units were taken from the batch.
	SpendTaken
	// SpendDenied: a refusal of global is in force (Denial).
	SpendDenied
	// SpendWait: another instance is refilling the key, for up to Wait µs.
	SpendWait
	// SpendRefill: the batch is short and the caller now holds the refill
	// lock: it asks global for Want units, returning Back units of the
	// lapsed batch named Batch.Mark in the same call.
	SpendRefill
)

// Spent is a pool's answer to a Spend.
type Spent struct {
	Outcome int
	// Units taken (SpendTaken), or moved out of a lapsed batch for the
	// refill to return (SpendRefill).
	Units int64
	// Now is the pool's time of the answer (µs).
	Now int64
	// Batch is the key's batch after the spend.
	Batch Batch
	// Denial is global's refusal in force (SpendDenied).
	Denial Denial
	// Want is how many units the refill asks global for (SpendRefill);
	// Wait how long the refill under way may still hold its lock.
	Want, Wait int64
}

// Batch is the units of one global grant as a pool keeps them.
type Batch struct {
	// Units are unspent; the batch is spent from until Expires (the
	// pool's µs), Sent + the lifetime at most, and for the window
	// counters no later than the end of the window global granted it in.
	Units, Expires int64
	// Sent is the pool's time when the refill was claimed, before global
	// decided: the batch's times count from it.
	Sent int64
	// Mark names the grant: global's receipt name (the window or log
	// entry it was counted in), for the token bucket Sent.
	Mark int64
	// Epoch names global's state that granted the batch (its receipt's
	// limiter.Receipt.Epoch), so units of it that reach global after an
	// admin reset are not credited to the fresh state.
	Epoch uint64
	// Time, Remaining and Reset are global's decision at the grant (µs).
	Time, Remaining, Reset int64
	// TakesBack is set when units spent from the batch may come back into
	// it (see Store.GiveBack).
	TakesBack bool
}

// Denial is global's refusal as a pool repeats it: made at Made (the
// pool's µs), repeated until Until, with global's decision (µs).
type Denial struct {
	Until, Made                   int64
	Remaining, Retry, Reset, Time int64
}

// PoolFill is what a refill brought back: a batch, or a refusal.
type PoolFill struct {
	Batch  Batch
	Denied bool
	Denial Denial
}

// Filled is a pool's answer to a Fill.
type Filled struct {
	// Ours is false when the caller no longer held the lock: nothing was
	// installed.
	Ours bool
	// Old is the units the replaced batch still held, named OldMark, of
	// global's state OldEpoch.
	Old, OldMark int64
	OldEpoch     uint64
}

// Outcomes of a Drain.
const (
	// DrainGone: the batch named is no longer in the pool, or it was
	// empty (it has ended all the same).
	DrainGone = iota
	// DrainTaken: Units were taken out.
	DrainTaken
	// DrainLater: the batch has not lapsed yet.
	DrainLater
)

// Drained is a pool's answer to a Drain.
type Drained struct {
	Outcome int
	Units   int64
}
