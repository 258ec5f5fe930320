package limiter

import (
	"slices"
	"testing"
)

// TestAlgorithmTable checks that the table describes every algorithm once
// and completely, since the stores read it without checking (the Redis
// store's own table is checked by its TestAlgorithmTable).
func TestAlgorithmTable(t *testing.T) {
	var names []Algorithm
	for _, alg := range algorithmTable {
		names = append(names, alg.name)
		if alg.newTables == nil {
			t.Errorf("%s: incomplete entry", alg.name)
		}
	}
	if !slices.Equal(names, Algorithms) {
		t.Errorf("table lists %v, Algorithms %v", names, Algorithms)
	}
	if Algorithm("nope").Known() || Algorithm("nope").Traits() != (Traits{}) {
		t.Error("an unknown algorithm is known or has traits")
	}
}
