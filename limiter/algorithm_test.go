package limiter

import (
	"slices"
	"testing"
)

// TestAlgorithmTable checks that the table describes every algorithm once
// and completely, since the stores read it without checking.
func TestAlgorithmTable(t *testing.T) {
	var names []Algorithm
	suffixes := map[string]Algorithm{}
	for _, alg := range algorithmTable {
		names = append(names, alg.name)
		if alg.newTables == nil || alg.redisArgs == nil || alg.scripts.one == "" || alg.scripts.batch == "" || alg.keySuffix == "" {
			t.Errorf("%s: incomplete entry", alg.name)
		}
		if other, dup := suffixes[alg.keySuffix]; dup {
			t.Errorf("%s and %s share the Redis key suffix %q", alg.name, other, alg.keySuffix)
		}
		suffixes[alg.keySuffix] = alg.name
		if alg.holdsSlots && alg.refundArg == nil {
			t.Errorf("%s: admissions hold slots but a refund names none", alg.name)
		}
	}
	if !slices.Equal(names, Algorithms) {
		t.Errorf("table lists %v, Algorithms %v", names, Algorithms)
	}
	if Algorithm("nope").Known() || Algorithm("nope").Traits() != (Traits{}) {
		t.Error("an unknown algorithm is known or has traits")
	}
}
