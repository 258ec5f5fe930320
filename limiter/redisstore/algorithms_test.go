package redisstore

import (
	"slices"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestAlgorithmTable checks that the Redis store's table describes every
// algorithm once and completely, since the store reads it without
// checking, and that only the algorithms that take a calendar have
// calendar scripts.
func TestAlgorithmTable(t *testing.T) {
	var names []limiter.Algorithm
	suffixes := map[string]limiter.Algorithm{}
	for _, alg := range algorithmTable {
		names = append(names, alg.name)
		if alg.redisArgs == nil || alg.scripts.one == "" || alg.scripts.batch == "" || alg.keySuffix == "" {
			t.Errorf("%s: incomplete entry", alg.name)
		}
		if other, dup := suffixes[alg.keySuffix]; dup {
			t.Errorf("%s and %s share the Redis key suffix %q", alg.name, other, alg.keySuffix)
		}
		suffixes[alg.keySuffix] = alg.name
		if alg.holdsSlots && alg.refundArg == nil {
			t.Errorf("%s: admissions hold slots but a refund names none", alg.name)
		}
		cal := limiter.Policy{Algorithm: alg.name, Events: 1, Calendar: &limiter.Calendar{Period: limiter.Day}}
		if takes := cal.Validate() == nil; takes != (alg.calendarScripts.one != "") {
			t.Errorf("%s: takes a calendar %v, has calendar scripts %v", alg.name, takes, alg.calendarScripts.one != "")
		}
	}
	if !slices.Equal(names, limiter.Algorithms) {
		t.Errorf("table lists %v, limiter.Algorithms %v", names, limiter.Algorithms)
	}
}
