package limiter

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAdmissionGivesBackWhatItHoldsOnce: an admission gives back at most
// what it took, never twice, and a refusal holds nothing.
func TestAdmissionGivesBackWhatItHoldsOnce(t *testing.T) {
	ctx := context.Background()
	m := mustMemory(t, Policy{Algorithm: FixedWindow, Events: 10, Window: time.Hour})
	a, _ := m.Take(ctx, "k", 3)
	if !a.Allowed || a.Held() != 3 {
		t.Fatalf("take of 3: allowed %v, held %d", a.Allowed, a.Held())
	}
	if _, err := a.GiveBack(ctx, 4); !errors.Is(err, ErrMoreThanHeld) {
		t.Fatalf("giving back 4 of 3: %v, want ErrMoreThanHeld", err)
	}
	st, err := a.GiveBack(ctx, 2)
	if err != nil || st.Remaining != 9 || a.Held() != 1 {
		t.Fatalf("giving back 2: remaining %d, held %d (%v); want 9, 1", st.Remaining, a.Held(), err)
	}
	if st, err = a.Release(ctx); err != nil || st.Remaining != 10 {
		t.Fatalf("release: remaining %d (%v), want 10", st.Remaining, err)
	}
	if _, err := a.Release(ctx); !errors.Is(err, ErrNothingHeld) {
		t.Fatalf("second release: %v, want ErrNothingHeld", err)
	}
	if _, err := a.GiveBack(ctx, 1); !errors.Is(err, ErrNothingHeld) {
		t.Fatalf("give-back after release: %v, want ErrNothingHeld", err)
	}
	if d, _ := m.Peek(ctx, "k"); d.Remaining != 10 {
		t.Fatalf("after all came back: remaining %d, want 10 (nothing twice)", d.Remaining)
	}

	for range 10 {
		_, _ = m.Take(ctx, "full", 1)
	}
	refused, _ := m.Take(ctx, "full", 1)
	if refused.Allowed || refused.Held() != 0 {
		t.Fatalf("refusal: allowed %v, held %d", refused.Allowed, refused.Held())
	}
	if _, err := refused.GiveBack(ctx, 1); !errors.Is(err, ErrNothingHeld) {
		t.Fatalf("give-back of a refusal: %v, want ErrNothingHeld", err)
	}
	if d, _ := m.Peek(ctx, "full"); d.Remaining != 0 {
		t.Fatalf("a refusal's give-back changed the state: remaining %d", d.Remaining)
	}
}

// TestAdmissionReturnsToTheStateThatTookIt: units go back to the store
// and state name of the admission, whichever store the caller holds now
// (an override or reload that changed the limit, a local fallback).
func TestAdmissionReturnsToTheStateThatTookIt(t *testing.T) {
	ctx := context.Background()
	p := Policy{Algorithm: FixedWindow, Events: 5, Window: time.Hour}
	first, second := mustMemory(t, p), mustMemory(t, p)
	a, _ := first.Take(ctx, "k", 2)
	_, _ = second.Take(ctx, "k", 1)
	if _, err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if d, _ := first.Peek(ctx, "k"); d.Remaining != 5 {
		t.Fatalf("first store after the release: remaining %d, want 5", d.Remaining)
	}
	if d, _ := second.Peek(ctx, "k"); d.Remaining != 4 {
		t.Fatalf("second store after the first's release: remaining %d, want 4 (untouched)", d.Remaining)
	}
}

// TestAdmissionChargesItsState: Charge takes more of the state that
// admitted, past the limit, and holds nothing more.
func TestAdmissionChargesItsState(t *testing.T) {
	ctx := context.Background()
	m := mustMemory(t, Policy{Algorithm: FixedWindow, Events: 5, Window: time.Hour})
	a, _ := m.Take(ctx, "k", 1)
	st, err := a.Charge(ctx, 5)
	if err != nil || st.Remaining != 0 || a.Held() != 1 {
		t.Fatalf("charge of 5 after 1: remaining %d, held %d (%v); want 0, 1", st.Remaining, a.Held(), err)
	}
	if d, _ := m.Take(ctx, "k", 1); d.Allowed {
		t.Fatal("a key in debt admitted a request")
	}
	var refused Admission
	if _, err := refused.Charge(ctx, 1); err == nil {
		t.Fatal("a refusal charged")
	}
}

// mustMemory is a memory store of p, failing the test if p is invalid.
func mustMemory(t *testing.T, p Policy) *Memory {
	t.Helper()
	m, err := NewMemory(p, MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
