package limiter

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// maxScaled bounds every scaled product (Burst×Window, Events×Window) so the
// integer arithmetic of the algorithms cannot overflow int64.
const maxScaled = 1 << 61

// logUnitBits is how many bits of a sliding-log entry hold its units; the
// rest hold the admission time in microseconds.
const logUnitBits = 12

// Policy is one limit: how many units (Events) per Window, with the
// algorithm that enforces it. The zero value is not usable; Validate says why.
type Policy struct {
	Algorithm Algorithm
	// Events is L, the quota per Window (for Concurrency: requests in flight).
	Events int64
	// Window is W. Only whole microseconds count.
	Window time.Duration
	// Burst is B, the bucket capacity of TokenBucket and LeakyBucket;
	// zero means Events.
	Burst int64
	// MaxDelay is how long LeakyBucket may hold a request; nil means the
	// default (B-1)/r, which admits B unit requests at once.
	MaxDelay *time.Duration
	// Calendar, for FixedWindow only, aligns windows to a time zone's
	// days, weeks or months instead of Window, which must then be zero:
	// Events is the quota of each calendar window.
	Calendar *Calendar
}

// params is a Policy compiled into the integers the algorithms compute with.
type params struct {
	alg *algorithm
	l   int64 // events
	w   int64 // window, microseconds
	b   int64 // burst
	// maxDelay is leaky bucket's longest hold, in microseconds scaled by l.
	maxDelay int64
	// maxAhead bounds how far a bucket's tat may lie ahead of now, in µs,
	// so a clock stepped backwards cannot overflow the scaled arithmetic.
	maxAhead int64
	// cal, for a policy with a Calendar, gives its windows; w is then a
	// bound on their length, for the exactness checks only.
	cal *CalendarWindows
}

// Compiled is a Policy compiled into the integers the algorithms compute
// with: what a store outside this package (limiter/redisstore,
// limiter/nearcache) needs of a policy, checked once by Compile. Its
// fields are read only.
type Compiled struct {
	// Policy is the policy compiled.
	Policy Policy
	// L is Events; W is Window in µs (for a calendar policy, a bound on
	// its windows' length, which only exactness checks read); B is the
	// bucket capacity, Events unless Burst sets it.
	L, W, B int64
	// MaxDelay is a leaky bucket's longest hold, in µs scaled by L (zero
	// for the other algorithms).
	MaxDelay int64
	// MaxAhead bounds how far a bucket's tat may lie ahead of now, in µs,
	// so a clock stepped backwards cannot overflow the scaled arithmetic.
	MaxAhead int64
	// Windows gives a calendar policy's windows; nil without a Calendar.
	Windows *CalendarWindows
}

// Compile checks p as Validate does and compiles it.
func (p Policy) Compile() (Compiled, error) {
	c, err := p.compile()
	if err != nil {
		return Compiled{}, err
	}
	return Compiled{Policy: p, L: c.l, W: c.w, B: c.b, MaxDelay: c.maxDelay, MaxAhead: c.maxAhead, Windows: c.cal}, nil
}

// Validate reports why p cannot be enforced, or nil.
func (p Policy) Validate() error {
	_, err := p.compile()
	return err
}

func (p Policy) compile() (params, error) {
	alg := lookupAlgorithm(p.Algorithm)
	if alg == nil {
		return params{}, fmt.Errorf("unknown algorithm %q (want one of %v)", p.Algorithm, Algorithms)
	}
	if p.Events <= 0 {
		return params{}, fmt.Errorf("events must be positive, got %d", p.Events)
	}
	if p.Calendar != nil {
		return p.compileCalendar(alg)
	}
	if p.Window <= 0 {
		return params{}, fmt.Errorf("window must be positive, got %v", p.Window)
	}
	w := p.Window.Microseconds()
	if w <= 0 {
		return params{}, fmt.Errorf("window must be at least 1µs, got %v", p.Window)
	}
	b := p.Burst
	if b < 0 {
		return params{}, fmt.Errorf("burst must not be negative, got %d", b)
	}
	if b == 0 {
		b = p.Events
	}
	c := params{alg: alg, l: p.Events, w: w, b: b}
	// Scaled products the algorithms form: B×W and L×W, with room for a
	// cost of up to B on top.
	for _, f := range []int64{b, p.Events} {
		if hi, lo := bits.Mul64(uint64(f)*2, uint64(w)); hi != 0 || lo >= maxScaled {
			return params{}, fmt.Errorf("events or burst (%d) times window (%v) is too large to compute exactly", f, p.Window)
		}
	}
	if alg.HoldsRequests {
		if p.MaxDelay == nil {
			c.maxDelay = (b - 1) * w
		} else {
			md := p.MaxDelay.Microseconds()
			if md < 0 {
				return params{}, errors.New("max_delay must not be negative")
			}
			if hi, lo := bits.Mul64(uint64(md), uint64(p.Events)); hi != 0 || lo >= maxScaled {
				return params{}, fmt.Errorf("max_delay %v is too long for events %d", *p.MaxDelay, p.Events)
			}
			c.maxDelay = md * p.Events
		}
	}
	c.maxAhead = (c.b*c.w+c.maxDelay)/c.l*2 + 1
	return c, nil
}

// maxCalendarEvents bounds a calendar policy's Events: counts up to twice
// it stay exact in the Redis scripts' doubles.
const maxCalendarEvents = 1 << 51

// compileCalendar compiles a fixed window over calendar windows. The fixed
// window forms no product of events and window, so only the counts' own
// bound applies.
func (p Policy) compileCalendar(alg *algorithm) (params, error) {
	if !alg.calendar {
		return params{}, fmt.Errorf("a calendar applies only to %s, not %s", FixedWindow, p.Algorithm)
	}
	if err := p.Calendar.Validate(); err != nil {
		return params{}, err
	}
	if p.Window != 0 {
		return params{}, fmt.Errorf("a calendar policy takes no window (its windows are calendar %ss), got %v", p.Calendar.Period, p.Window)
	}
	if p.Burst != 0 && p.Burst != p.Events {
		return params{}, fmt.Errorf("a calendar policy takes no burst, got %d", p.Burst)
	}
	if p.Events > maxCalendarEvents {
		return params{}, fmt.Errorf("events %d is too large to count exactly (at most %d)", p.Events, int64(maxCalendarEvents))
	}
	cal := *p.Calendar
	return params{alg: alg, l: p.Events, w: cal.longest(), b: p.Events, cal: newCalendarWindows(cal)}, nil
}

// MaxCost is the largest cost a single request may have under p: more than
// this could never pass, so configuration refuses it.
func (p Policy) MaxCost() int64 {
	if p.Algorithm.Traits().Bucket && p.Burst > 0 {
		return p.Burst
	}
	return p.Events
}

// Quota is what response headers report for p: q units per w. Window
// algorithms report L per W; the buckets report their capacity B and the time
// to refill it from empty, B/r, so a bucket's burst is visible to clients.
// A calendar policy reports L per the calendar window the wall clock is in
// now; QuotaAt names the time.
func (p Policy) Quota() (q int64, w time.Duration) {
	if p.Calendar != nil {
		return p.QuotaAt(time.Now())
	}
	return p.QuotaAt(time.Time{})
}

// QuotaAt is Quota at time t: for a calendar policy, L per the length of
// the calendar window t falls in (23 hours for a day that springs
// forward); for any other, Quota, whatever t.
func (p Policy) QuotaAt(t time.Time) (q int64, w time.Duration) {
	if p.Calendar != nil {
		start, end := p.Calendar.bounds(t.UnixMicro())
		return p.Events, microseconds(end - start)
	}
	if p.Algorithm.Traits().Bucket {
		b := p.Burst
		if b == 0 {
			b = p.Events
		}
		// B/r = B×W/L, rounded up to whole microseconds.
		num := float64(b) * float64(p.Window.Microseconds()) / float64(p.Events)
		return b, time.Duration(math.Ceil(num)) * time.Microsecond
	}
	return p.Events, p.Window
}

// String is a stable description of every field that changes decisions: two
// policies with the same String share state, so a config reload that keeps
// it keeps the counters.
func (p Policy) String() string {
	if p.Calendar != nil {
		// A calendar policy has neither window nor burst of its own.
		return fmt.Sprintf("%s:%d/calendar=%s", p.Algorithm, p.Events, p.Calendar)
	}
	s := fmt.Sprintf("%s:%d/%dus", p.Algorithm, p.Events, p.Window.Microseconds())
	if p.Burst > 0 && p.Burst != p.Events {
		s += fmt.Sprintf(":burst=%d", p.Burst)
	}
	if p.MaxDelay != nil {
		s += fmt.Sprintf(":max_delay=%dus", p.MaxDelay.Microseconds())
	}
	return s
}
