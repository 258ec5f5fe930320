package limiter

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// onePerHour is a policy under which a key's first Take passes and every
// later one is denied, so a Take tells whether the store remembers the key.
var onePerHour = Policy{Algorithm: FixedWindow, Events: 1, Window: time.Hour}

// remembered reports whether m still holds key's state under onePerHour.
// It takes, so an unknown key is created (and may evict another).
func remembered(m *Memory, key string) bool {
	d, _ := m.Take(context.Background(), key, 1)
	return !d.Allowed
}

func TestMemoryLRUEviction(t *testing.T) {
	m, _ := newTestMemory(t, onePerHour, MemoryOptions{MaxKeys: 3})
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if d, _ := m.Take(ctx, k, 1); !d.Allowed {
			t.Fatalf("first take of %s denied", k)
		}
	}
	// Touching a makes b the least recently used.
	if !remembered(m, "a") {
		t.Fatal("a forgotten before the store was full")
	}
	m.Take(ctx, "d", 1)
	if n := m.Len(); n != 3 {
		t.Fatalf("Len = %d after a fourth key, want 3", n)
	}
	if !remembered(m, "a") {
		t.Error("recently used a was evicted")
	}
	// b was evicted: it comes back fresh (and evicts c, now the oldest).
	if remembered(m, "b") {
		t.Error("least recently used b was kept")
	}
	if remembered(m, "c") {
		t.Error("c, least recently used once b came back, was kept")
	}
	if n := m.Len(); n != 3 {
		t.Fatalf("Len = %d, want 3", n)
	}
}

// TestMemoryMaxKeysBound: however many keys arrive, the store never holds
// more than MaxKeys, and a bound large enough for several shards is
// nearly used up before keys are evicted.
func TestMemoryMaxKeysBound(t *testing.T) {
	for _, n := range []int{1, 3, 100, 2047, 5000, 70_000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			m, _ := newTestMemory(t, onePerHour, MemoryOptions{MaxKeys: n})
			ctx := context.Background()
			for i := range 3 * n {
				m.Take(ctx, fmt.Sprint("key-", i), 1)
				if i < n && m.Len() != i+1 && n <= 2*minShardKeys {
					t.Fatalf("one-shard store evicted at %d keys, bound %d", i+1, n)
				}
			}
			got := m.Len()
			if got > n {
				t.Fatalf("Len = %d, above MaxKeys %d", got, n)
			}
			// Shards fill unevenly by a few standard deviations of their
			// share at most.
			if got < n*9/10 {
				t.Fatalf("Len = %d, under 90%% of MaxKeys %d", got, n)
			}
		})
	}
}

func TestMemorySetMaxKeys(t *testing.T) {
	ctx := context.Background()
	t.Run("smaller bound applies as keys arrive", func(t *testing.T) {
		m, _ := newTestMemory(t, onePerHour, MemoryOptions{MaxKeys: 1000})
		for i := range 1000 {
			m.Take(ctx, fmt.Sprint(i), 1)
		}
		m.SetMaxKeys(10)
		if n := m.Len(); n != 1000 {
			t.Fatalf("Len = %d right after SetMaxKeys, want the 1000 still held", n)
		}
		m.Take(ctx, "new", 1)
		if n := m.Len(); n != 10 {
			t.Fatalf("Len = %d after a new key, want 10", n)
		}
		// The most recent keys stay.
		if !remembered(m, "999") || !remembered(m, "991") {
			t.Error("recent keys were evicted")
		}
	})
	t.Run("shard count change keeps state", func(t *testing.T) {
		m, _ := newTestMemory(t, onePerHour, MemoryOptions{})
		for i := range 500 {
			m.Take(ctx, fmt.Sprint(i), 1)
		}
		m.SetMaxKeys(100) // 64 shards to one: applies at once
		if n := m.Len(); n != 100 {
			t.Fatalf("Len = %d after SetMaxKeys(100), want 100", n)
		}
		m.SetMaxKeys(0) // back to DefaultMaxKeys and 64 shards
		if n := m.Len(); n != 100 {
			t.Fatalf("Len = %d after SetMaxKeys(0), want 100", n)
		}
		held := 0
		for i := range 500 {
			if remembered(m, fmt.Sprint(i)) {
				held++
			}
		}
		if held != 100 {
			t.Fatalf("%d keys kept their state across two reshards, want 100", held)
		}
	})
}

// TestMemorySweep: Sweep forgets exactly the keys whose state is back to
// empty, per algorithm, and leaves the others' state intact.
func TestMemorySweep(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		alg Algorithm
		// idle is taken at 0 and is empty from idleFrom on; busy is taken
		// at busyAt and is not yet empty at sweepAt.
		idleFrom, busyAt, sweepAt time.Duration
	}{
		{TokenBucket, 500 * ms, 900 * ms, 1 * s},            // one token refills in 0.5 s
		{LeakyBucket, 500 * ms, 900 * ms, 1 * s},            // one unit drains in 0.5 s
		{FixedWindow, 1 * s, 1500 * ms, 1600 * ms},          // idle's window ends
		{SlidingWindowLog, 1 * s, 1500 * ms, 1600 * ms},     // idle's entry leaves
		{SlidingWindowCounter, 2 * s, 1500 * ms, 2500 * ms}, // idle's count loses its weight
		{Concurrency, 0, 0, 0},                              // idle's unit is released
	}
	for _, c := range cases {
		t.Run(string(c.alg), func(t *testing.T) {
			p := Policy{Algorithm: c.alg, Events: 2, Window: time.Second}
			m, clock := newTestMemory(t, p, MemoryOptions{})
			base := clock.Now()
			d, _ := m.Take(ctx, "idle", 1)
			if c.alg == Concurrency {
				if n := m.Sweep(); n != 0 {
					t.Fatalf("Sweep forgot %d keys with a unit in flight", n)
				}
				m.GiveBack(ctx, "idle", 1, d.Receipt)
			} else {
				// One µs before idle is empty, nothing goes.
				clock.Set(base.Add(c.idleFrom - us))
				if n := m.Sweep(); n != 0 {
					t.Fatalf("early Sweep forgot %d keys, want 0", n)
				}
			}
			clock.Set(base.Add(c.busyAt))
			m.Take(ctx, "busy", 1)
			clock.Set(base.Add(c.sweepAt))
			if n := m.Sweep(); n != 1 {
				t.Fatalf("Sweep forgot %d keys, want 1", n)
			}
			if n := m.Len(); n != 1 {
				t.Fatalf("Len = %d after Sweep, want 1", n)
			}
			// busy kept its unit: one more fills its quota of 2.
			if d, _ := m.Take(ctx, "busy", 1); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("busy after Sweep: %+v, want allowed with 0 remaining", d)
			}
		})
	}
}

// logCapacity is how many entries key's sliding log has room for, and
// whether the store holds key at all. It reads the shard without touching.
func logCapacity(m *Memory, key string) (int, bool) {
	set := m.tables.(*shardSet[slidingLogState, *slidingLogState])
	h := maphash.String(m.seed, key)
	sh := set.lock(h)
	defer sh.mu.Unlock()
	i, ok := sh.index[h]
	if !ok {
		return 0, false
	}
	return cap(sh.cells[i].st.ents), true
}

// TestMemorySweepShrinksLog: a log that held many entries gives its memory
// back at Sweep once few remain, and is forgotten once none do.
func TestMemorySweepShrinksLog(t *testing.T) {
	ctx := context.Background()
	p := Policy{Algorithm: SlidingWindowLog, Events: 1000, Window: time.Second}
	m, clock := newTestMemory(t, p, MemoryOptions{})
	base := clock.Now()
	for i := range 1000 {
		clock.Set(base.Add(time.Duration(i) * ms))
		m.Take(ctx, "k", 1)
	}
	full, _ := logCapacity(m, "k")
	if full < 1000 {
		t.Fatalf("capacity %d with 1000 entries", full)
	}
	// At 1.990 s, only the entries of 990..999 ms are live.
	clock.Set(base.Add(1990 * ms))
	if n := m.Sweep(); n != 0 {
		t.Fatalf("Sweep forgot %d keys with live entries", n)
	}
	if c, ok := logCapacity(m, "k"); !ok || c > 100 {
		t.Fatalf("capacity %d (held %v) after Sweep with 9 live entries, was %d", c, ok, full)
	}
	if d, _ := m.Take(ctx, "k", 1); !d.Allowed || d.Remaining != 1000-10 {
		t.Fatalf("after compaction: %+v, want allowed with 990 remaining", d)
	}
	clock.Set(base.Add(3 * s))
	if n := m.Sweep(); n != 1 {
		t.Fatalf("Sweep forgot %d keys, want the expired log", n)
	}
	if _, ok := logCapacity(m, "k"); ok {
		t.Fatal("expired log still held")
	}
}

func TestMemorySeededHash(t *testing.T) {
	a, _ := NewMemory(onePerHour, MemoryOptions{})
	b, _ := NewMemory(onePerHour, MemoryOptions{})
	same := 0
	for i := range 8 {
		k := fmt.Sprint("client-", i)
		if maphash.String(a.seed, k) == maphash.String(b.seed, k) {
			same++
		}
	}
	if same > 0 {
		t.Fatalf("two stores hashed %d of 8 keys alike: the seed is not per store", same)
	}
}

// TestMemoryReturnForgottenKey: a Return for a key the store has forgotten
// gives nothing back and creates no state.
func TestMemoryReturnForgottenKey(t *testing.T) {
	ctx := context.Background()
	for _, a := range Algorithms {
		t.Run(string(a), func(t *testing.T) {
			m, _ := newTestMemory(t, Policy{Algorithm: a, Events: 2, Window: time.Second}, MemoryOptions{MaxKeys: 1})
			d, _ := m.Take(ctx, "gone", 1)
			m.Take(ctx, "other", 1) // evicts gone
			r, _ := m.GiveBack(ctx, "gone", 1, d.Receipt)
			if !r.Allowed || r.Remaining != 2 {
				t.Fatalf("Return of a forgotten key: %+v, want a fresh state", r)
			}
			if n := m.Len(); n != 1 {
				t.Fatalf("Len = %d, want 1", n)
			}
		})
	}
}

// TestMemoryConcurrent runs many goroutines taking and returning on
// overlapping keys while another sweeps and the clock moves, then checks
// what must hold whatever the interleaving. Run it with -race.
func TestMemoryConcurrent(t *testing.T) {
	const (
		workers = 8
		ops     = 2000
		keys    = 5
		l       = 3
	)
	w := 10 * time.Millisecond
	type admission struct {
		key int
		at  int64
	}
	for _, a := range []Algorithm{Concurrency, FixedWindow, SlidingWindowLog, TokenBucket} {
		t.Run(string(a), func(t *testing.T) {
			ctx := context.Background()
			clock := &testutil.Clock{}
			clock.SetMicro(1_700_000_000_000_000)
			m, err := NewMemory(Policy{Algorithm: a, Events: l, Window: w}, MemoryOptions{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			var inFlight [keys]atomic.Int64
			var mu sync.Mutex
			var admitted []admission
			stop := make(chan struct{})
			var bg sync.WaitGroup
			bg.Add(1)
			go func() { // sweeper and clock
				defer bg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if a != TokenBucket { // the bucket's check needs a frozen clock
						clock.Advance(500 * time.Microsecond)
					}
					m.Sweep()
				}
			}()
			var wg sync.WaitGroup
			for g := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					for range ops {
						k := rng.IntN(keys)
						key := fmt.Sprint("k", k)
						d, _ := m.Take(ctx, key, 1)
						if !d.Allowed {
							continue
						}
						switch a {
						case Concurrency:
							if n := inFlight[k].Add(1); n > l {
								t.Errorf("%d in flight for %s, limit %d", n, key, l)
							}
							inFlight[k].Add(-1)
							m.GiveBack(ctx, key, 1, d.Receipt)
						case TokenBucket:
							m.GiveBack(ctx, key, 1, d.Receipt)
						default:
							mu.Lock()
							admitted = append(admitted, admission{k, d.Time})
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			close(stop)
			bg.Wait()

			switch a {
			case Concurrency, TokenBucket:
				// Every unit was given back: each key takes its full quota.
				for k := range keys {
					d, _ := m.Take(ctx, fmt.Sprint("k", k), l)
					if !d.Allowed || d.Remaining != 0 {
						t.Errorf("k%d after all returns: %+v, want all %d units free", k, d, l)
					}
				}
			case FixedWindow:
				perWindow := map[[2]int64]int{}
				for _, ad := range admitted {
					perWindow[[2]int64{int64(ad.key), ad.at / w.Microseconds()}]++
				}
				for kw, n := range perWindow {
					if n > l {
						t.Errorf("key k%d window %d admitted %d, limit %d", kw[0], kw[1], n, l)
					}
				}
			case SlidingWindowLog:
				byKey := map[int][]int64{}
				for _, ad := range admitted {
					byKey[ad.key] = append(byKey[ad.key], ad.at)
				}
				for k, ats := range byKey {
					sort.Slice(ats, func(i, j int) bool { return ats[i] < ats[j] })
					// Any l+1 admissions span more than a window.
					for i := l; i < len(ats); i++ {
						if ats[i]-ats[i-l] < w.Microseconds() {
							t.Errorf("k%d: %d admissions within %dus, limit %d per %v", k, l+1, ats[i]-ats[i-l], l, w)
							break
						}
					}
				}
			}
			if len(admitted) == 0 && (a == FixedWindow || a == SlidingWindowLog) {
				t.Error("nothing admitted")
			}
		})
	}
}

// TestShardSize keeps a shard two whole cache lines: a shard sharing a line
// with its neighbour makes goroutines on different keys contend.
func TestShardSize(t *testing.T) {
	if n := unsafe.Sizeof(shard[tokenBucketState, *tokenBucketState]{}); n != 128 {
		t.Fatalf("shard is %d bytes, want 128: adjust its padding", n)
	}
}

// TestAdmissionSize keeps an Admission 128 bytes: past that, Go copies it
// with a loop instead of unrolled 16-byte moves, and each layer a memory
// decision passes it through costs a third more (docs/design.md, "The
// stores' contract").
func TestAdmissionSize(t *testing.T) {
	if n := unsafe.Sizeof(Admission{}); n != 128 {
		t.Fatalf("Admission is %d bytes, want 128", n)
	}
}

// TestMemorySharingCountsOneSetInFlight: views of one concurrency store
// under other limits count the same requests in flight, give slots back
// into the same count, and only concurrency stores can be shared.
func TestMemorySharingCountsOneSetInFlight(t *testing.T) {
	ctx := context.Background()
	five, err := NewMemory(Policy{Algorithm: Concurrency, Events: 5, Window: time.Minute}, MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	two, err := five.Sharing(Policy{Algorithm: Concurrency, Events: 2, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := five.Take(ctx, "k", 1)
	b, _ := two.Take(ctx, "k", 1)
	if c, _ := two.Take(ctx, "k", 1); !a.Allowed || !b.Allowed || c.Allowed {
		t.Fatalf("under 2 with one in flight under 5: %v %v %v, want the third refused", a.Allowed, b.Allowed, c.Allowed)
	}
	if d, _ := five.Take(ctx, "k", 1); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("under 5 with two in flight: %+v, want allowed with 2 left", d)
	}
	if _, err := two.GiveBack(ctx, "k", 1, a.Receipt); err != nil {
		t.Fatal(err)
	}
	if d, _ := five.Peek(ctx, "k"); d.Remaining != 3 {
		t.Fatalf("after one finished: %d left under 5, want 3", d.Remaining)
	}
	window, _ := NewMemory(Policy{Algorithm: FixedWindow, Events: 5, Window: time.Minute}, MemoryOptions{})
	if _, err := window.Sharing(Policy{Algorithm: FixedWindow, Events: 2, Window: time.Minute}); err == nil {
		t.Fatal("a fixed window's state was shared under another limit")
	}
}

// TestMemoryGiveBackAfterSweepOrEviction: a key swept (its state back to
// empty) or evicted, then taken again, has a new state, to which the
// give-back of an admission of the earlier state credits nothing (as a
// state back to empty and not swept: epochs.judge).
func TestMemoryGiveBackAfterSweepOrEviction(t *testing.T) {
	ctx := context.Background()
	p := Policy{Algorithm: TokenBucket, Events: 3, Window: time.Hour}
	for _, forget := range []string{"sweep", "evict"} {
		t.Run(forget, func(t *testing.T) {
			m, clock := newTestMemory(t, p, MemoryOptions{MaxKeys: 1})
			first, _ := m.Take(ctx, "k", 1)
			// A window on, the bucket is full again: the state is
			// empty, and Sweep forgets it.
			clock.Advance(time.Hour)
			switch forget {
			case "sweep":
				if n := m.Sweep(); n != 1 {
					t.Fatalf("swept %d keys, want 1", n)
				}
			case "evict":
				m.Take(ctx, "other", 1)
			}
			giveBackToFreshState(t, m, "k", 3, first)
		})
	}
}

// TestMemoryNewKeyNamesItsState: a key's first take names the state it
// made even when the algorithm does not judge that state empty: a
// calendar window on a clock before the Unix epoch sees the new key's
// zero window as ahead of now. Named 0 ("no state"), such an admission's
// units went back to whatever state the key had by then, after a reset a
// fresh one that never counted them.
func TestMemoryNewKeyNamesItsState(t *testing.T) {
	ctx := context.Background()
	p := Policy{Algorithm: FixedWindow, Events: 3, Calendar: &Calendar{Period: Day, Location: time.UTC}}
	clock := testutil.NewClock(time.Unix(-10*86400, 0))
	m, err := NewMemory(p, MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := m.Take(ctx, "k", 1)
	if !first.Allowed || first.Receipt.Epoch == 0 {
		t.Fatalf("first take: allowed %v, epoch %d; want an admission naming its state", first.Allowed, first.Receipt.Epoch)
	}
	if _, err := m.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	giveBackToFreshState(t, m, "k", 3, first)
}

// giveBackToFreshState checks that key, its earlier state forgotten,
// admits its whole limit afresh, and that a give-back of first (taken
// from the earlier state) then lets nothing more in: the fresh state
// never counted its units.
func giveBackToFreshState(t *testing.T, m *Memory, key string, limit int, first Admission) {
	t.Helper()
	if n := takeAll(m, key); n != limit {
		t.Fatalf("admitted %d of a fresh state, want %d", n, limit)
	}
	if _, err := first.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := takeAll(m, key); n != 0 {
		t.Errorf("admitted %d after a give-back of units the fresh state never counted, want 0", n)
	}
}

// TestMemoryEpochsAcrossReshard: a change of the shard count keeps each
// state's epoch (a give-back still reaches the state that took the units)
// and numbers no later state of a key as an earlier one, though each
// shard numbers its own: 300 keys numbered in one shard spread over 64.
func TestMemoryEpochsAcrossReshard(t *testing.T) {
	ctx := context.Background()
	p := Policy{Algorithm: FixedWindow, Events: 3, Window: time.Hour}
	m, _ := newTestMemory(t, p, MemoryOptions{MaxKeys: 1000}) // one shard
	var held []Admission
	for i := range 300 {
		a, _ := m.Take(ctx, fmt.Sprint(i), 1)
		held = append(held, a)
	}
	m.SetMaxKeys(0) // 64 shards
	for i, a := range held[:10] {
		if d, _ := a.Release(ctx); d.Remaining != 3 {
			t.Fatalf("key %d: the give-back after a reshard left remaining %d, want 3", i, d.Remaining)
		}
	}
	for i, a := range held[10:] {
		key := fmt.Sprint(10 + i)
		for range 400 {
			m.Reset(ctx, key)
			b, _ := m.Take(ctx, key, 1)
			if b.Receipt.Epoch == a.Receipt.Epoch {
				t.Fatalf("key %s: a later state numbered %d, as the one before the reshard", key, b.Receipt.Epoch)
			}
		}
		if d, _ := a.Release(ctx); d.Remaining != 2 {
			t.Fatalf("key %s: the give-back after resets left remaining %d, want the fresh state's 2", key, d.Remaining)
		}
	}
}

// takeAll takes unit requests of key until one is refused and reports
// how many passed (at most 100).
func takeAll(m *Memory, key string) int {
	n := 0
	for range 100 {
		if d, _ := m.Take(context.Background(), key, 1); !d.Allowed {
			break
		}
		n++
	}
	return n
}

// TestMemoryAdmissionReceipts: what a memory store's answers carry
// beside their Decision, for every algorithm. An admission holds its
// units of its key in the store, decided and received at the store's
// time (a window's start while the clock is behind it), names the state
// it took from (Receipt.Epoch, a new one after a reset), is named by its
// log time in a sliding log (Mark: a lease's is LeaseLifetime ahead), and
// says what it took (Granted) only for the algorithms that lease or
// charge; a refusal carries the time and nothing else; a charge holds
// nothing and names the state it charged.
func TestMemoryAdmissionReceipts(t *testing.T) {
	ctx := context.Background()
	for _, alg := range Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			p := Policy{Algorithm: alg, Events: 3, Window: time.Second}
			m, clock := newTestMemory(t, p, MemoryOptions{})
			base := alignedBase(p)
			log := alg == SlidingWindowLog
			leases := m.p.alg.Leases
			admitted := func(what string, a Admission, units, mark int64) uint64 {
				t.Helper()
				want := Receipt{At: a.Time, Mark: mark, Epoch: a.Receipt.Epoch}
				if leases {
					want.Granted = units
				}
				if !a.Allowed || a.Receipt != want || a.Receipt.Epoch == 0 || a.Held() != units || a.key != "k" || a.store != Store(m) {
					t.Fatalf("%s: %+v %+v (held %d of %q, in the store %v); want admitted, receipt %+v with an epoch, holding %d of \"k\" in the store",
						what, a.Decision, a.Receipt, a.Held(), a.key, a.store == Store(m), want, units)
				}
				return a.Receipt.Epoch
			}
			refused := func(what string, a Admission, at int64) {
				t.Helper()
				if a.Allowed || a.Time != at || a.Receipt != (Receipt{At: at}) || a.Held() != 0 || a.key != "" || a.store != nil {
					t.Fatalf("%s: %+v %+v (held %d of %q, in a store %v); want refused at %d with a receipt of its time only, holding nothing", what, a.Decision, a.Receipt, a.Held(), a.key, a.store != nil, at)
				}
			}
			a, _ := m.Take(ctx, "k", 1)
			mark := int64(0)
			if log {
				mark = base
			}
			if a.Time != base {
				t.Fatalf("first take decided at %d, want %d", a.Time, base)
			}
			epoch := admitted("first take", a, 1, mark)
			for i := 2; ; i++ {
				a, _ = m.Take(ctx, "k", 1)
				if !a.Allowed {
					refused(fmt.Sprintf("take %d", i), a, base)
					break
				}
				if got := admitted(fmt.Sprintf("take %d", i), a, 1, mark); got != epoch {
					t.Fatalf("take %d names state %d, the first %d", i, got, epoch)
				}
				if i > 10 {
					t.Fatal("never refused")
				}
			}
			if m.p.alg.Charges {
				c, err := m.Charge(ctx, "k", 2)
				want := Receipt{At: base, Mark: mark, Epoch: epoch, Granted: 2}
				if err != nil || !c.Allowed || c.Receipt != want || c.Held() != 0 || c.store != nil || c.Time != base {
					t.Fatalf("charge: %+v %+v, %v (held %d, in a store %v); want allowed, receipt %+v, holding nothing", c.Decision, c.Receipt, err, c.Held(), c.store != nil, want)
				}
			}
			if leases {
				l, err := m.TakeUpTo(ctx, "lease", 1, 2)
				lmark := int64(0)
				if log {
					lmark = base + LeaseLifetime.Microseconds()
				}
				if err != nil || !l.Allowed || l.Held() != 2 || l.key != "lease" || l.Receipt != (Receipt{At: base, Mark: lmark, Epoch: l.Receipt.Epoch, Granted: 2}) || l.Receipt.Epoch == 0 {
					t.Fatalf("lease of 1 up to 2: %+v, %v (held %d of %q); want 2 granted and held, marked %d", l, err, l.Held(), l.key, lmark)
				}
			}
			if _, err := m.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			a, _ = m.Take(ctx, "k", 1)
			if got := admitted("take after a reset", a, 1, mark); got <= epoch {
				t.Fatalf("take after a reset names state %d, not one after %d", got, epoch)
			}
			if alg != FixedWindow && alg != SlidingWindowCounter {
				return
			}
			// A clock behind the stored window decides at its start.
			next := base + p.Window.Microseconds()
			clock.SetMicro(next + 10)
			if a, _ = m.Take(ctx, "k", 1); !a.Allowed || a.Time != next+10 {
				t.Fatalf("take in the next window: %+v, want admitted at %d", a, next+10)
			}
			clock.SetMicro(next - 10)
			a, _ = m.Take(ctx, "k", 3)
			refused("take behind the window", a, next)
		})
	}
}
