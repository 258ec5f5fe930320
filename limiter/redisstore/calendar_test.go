package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// calendarDayRedis starts a Redis and, on it, a fixed window of events a
// UTC calendar day (zone "cal"), returned with its client and policy. Its
// options name no Clock, so its scripts read Redis's TIME, the clock these
// tests are about; the timeout is generous, as they measure no latency.
func calendarDayRedis(t *testing.T, events int64) (*Store, *redis.Client, limiter.Policy) {
	t.Helper()
	client := redistest.Start(t).Client(t)
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: events, Calendar: &limiter.Calendar{Period: limiter.Day}}
	return newTestRedis(t, client, p, Options{Zone: "cal", Timeout: 5 * time.Second}), client, p
}

// TestCalendarRedisServerTime: with Redis's TIME as the clock, a calendar
// day is counted and reset at the coming UTC midnight, and its key lives
// exactly until then.
func TestCalendarRedisServerTime(t *testing.T) {
	r, client, p := calendarDayRedis(t, 2)
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		d, err := r.Take(ctx, "k", 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("take %d: %+v, %v; want allowed %v", i, d, err, want)
		}
		end := d.At().Add(d.ResetAfter)
		if end.UTC().Format(time.TimeOnly) != "00:00:00" || end.Sub(d.At()) > 24*time.Hour {
			t.Fatalf("take %d resets at %s, want the coming UTC midnight", i, end.UTC())
		}
	}
	ttl, err := client.PTTL(ctx, r.Key("k")).Result()
	if err != nil {
		t.Fatal(err)
	}
	_, end := p.Calendar.Window(time.Now())
	if left := time.Until(end); ttl < left-2*time.Second || ttl > left+2*time.Second {
		t.Fatalf("key lives %v, the window %v more", ttl, left)
	}
}

// TestCalendarRedisWindowsAroundTheInstance: the script decides in the
// window, among those the instance sent, that holds Redis's TIME, so an
// instance whose clock is already in the next day still counts in
// Redis's day; one whose windows hold no part of Redis's time gets an
// error, for the fail mode, not a decision in a window nobody named.
func TestCalendarRedisWindowsAroundTheInstance(t *testing.T) {
	r, client, p := calendarDayRedis(t, 5)
	ctx := context.Background()
	compiled, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	cw := compiled.Windows
	run := func(instance time.Time) ([]int64, error) {
		w := cw.Around(instance.UnixMicro())
		args := append([]any{1, "", p.Events}, w.Args[:]...)
		return r.script.Run(ctx, client, []string{r.Key("skewed")}, args...).Int64Slice()
	}
	now := time.Now()
	reply, err := run(now.Add(24 * time.Hour)) // the instance a day ahead
	if err != nil {
		t.Fatal(err)
	}
	_, end := p.Calendar.Window(time.UnixMicro(reply[4]))
	if reply[0] != 1 || reply[1] != 4 || reply[2] != end.Sub(time.UnixMicro(reply[4])).Microseconds() {
		t.Fatalf("reply %v: want an admission with 4 left, counted in Redis's day ending %s", reply, end)
	}
	if _, err := run(now.Add(3 * 24 * time.Hour)); err == nil || !strings.Contains(err.Error(), "not within the windows") {
		t.Fatalf("windows three days ahead: %v, want an error", err)
	}
}
