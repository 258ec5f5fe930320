package ratelimit

import (
	"net/http"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestReviewZoneAfterRefusalCountsNoDecision: the README: zones after the
// refusing one are not decided (their keys and costs are read, nothing is
// taken); design.md: metrics are those of deciding one zone after
// another. A zone after the refusal whose key is exempt, or whose dry_run
// cost is invalid, must then count no decision for the refused request:
// it counts one allowed (exempt) or dry_run_denied (invalid cost), and an
// override decision, for a request it never decided.
func TestReviewZoneAfterRefusalCountsNoDecision(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_rv_mx_first {
			key ip
			rate 1/1h
		}
		zone b_rv_mx_exempt {
			key ip
			rate 10/1h
		}
		zone c_rv_mx_dry {
			key ip
			rate 10/1h
			cost {http.request.header.X-Cost}
			dry_run
		}
	}`)
	const ip = "198.51.100.190"
	setOverride(t, h, "b_rv_mx_exempt", ip, limiter.Override{Action: limiter.OverrideExempt})
	b, c := handlerZone(t, h, "b_rv_mx_exempt"), handlerZone(t, h, "c_rv_mx_dry")
	r, _ := newKeyRequest(ip, map[string]string{"X-Cost": "bad"})
	if _, code := serve(h, r, okHandler); code != 200 {
		t.Fatalf("first: %d", code)
	}
	allowed, exempt, dry := counterValue(t, b.metrics.allowed), counterValue(t, b.metrics.overridden[limiter.OverrideExempt-1]), counterValue(t, c.metrics.dryRunDenied)
	r, _ = newKeyRequest(ip, map[string]string{"X-Cost": "bad"})
	if _, code := serve(h, r, okHandler); code != http.StatusTooManyRequests {
		t.Fatalf("second: %d, want 429 from a", code)
	}
	if got := counterValue(t, b.metrics.allowed) - allowed; got != 0 {
		t.Errorf("b (exempt, after the refusal) counted %v allowed decisions for the refused request, want 0", got)
	}
	if got := counterValue(t, b.metrics.overridden[limiter.OverrideExempt-1]) - exempt; got != 0 {
		t.Errorf("b counted %v exempt override decisions for the refused request, want 0", got)
	}
	if got := counterValue(t, c.metrics.dryRunDenied) - dry; got != 0 {
		t.Errorf("c (dry_run, invalid cost, after the refusal) counted %v dry_run_denied for the refused request, want 0", got)
	}
}
