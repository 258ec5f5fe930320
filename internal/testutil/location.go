package testutil

import (
	"testing"
	"time"
)

// MustLoad is the time zone name, or fails the test. A package whose
// tests need zones the OS may lack imports time/tzdata.
func MustLoad(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}
