package ratelimit

import (
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

func TestTiersPickLimitAndKeepStateApart(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone tiered {
			key header X-API-Key
			algorithm fixed_window
			rate 1/1h
			tier {http.request.header.X-Plan} {
				free 2/1h
				pro 4/1h
			}
		}
	}`)
	send := func(key, plan string) (int, string) {
		hdrs := map[string]string{"X-API-Key": key}
		if plan != "" {
			hdrs["X-Plan"] = plan
		}
		r, _ := newKeyRequest("198.51.100.20", hdrs)
		w, code := serve(h, r, okHandler)
		return code, w.Header().Get("RateLimit-Policy")
	}
	for _, tc := range []struct {
		plan   string
		allow  int
		policy string
	}{
		{"free", 2, `"tiered";q=2;w=3600`},
		{"pro", 4, `"tiered";q=4;w=3600`},
		{"gold", 1, `"tiered";q=1;w=3600`}, // not listed: the zone's own limit
		{"", 1, `"tiered";q=1;w=3600`},
	} {
		key := "k-" + tc.plan
		for i := 0; i <= tc.allow; i++ {
			code, policy := send(key, tc.plan)
			want := 200
			if i == tc.allow {
				want = 429
			}
			if code != want || policy != tc.policy {
				t.Fatalf("plan %q request %d: %d %q, want %d %q", tc.plan, i, code, policy, want, tc.policy)
			}
		}
	}
	// The same key on another tier has state of its own.
	if code, _ := send("k-free", "pro"); code != 200 {
		t.Fatalf("k-free on the pro tier shared the free tier's state: %d", code)
	}
}

func TestFailModesWhenRedisIsUnreachable(t *testing.T) {
	addr := testutil.ClosedAddr(t)
	for _, tc := range []struct {
		fail      string
		codes     []int
		retry     string
		rlHeaders bool
	}{
		{"open", []int{200, 200, 200}, "", false},
		{"closed", []int{503, 503}, "1", false},
		{"local", []int{200, 200, 429}, "", true},
	} {
		t.Run(tc.fail, func(t *testing.T) {
			h := provisionHandler(t, `rate_limit {
				zone fail_`+tc.fail+` {
					rate 2/1h
					store redis
					fail `+tc.fail+`
				}
				redis {
					addresses `+addr+`
					timeout 200ms
				}
			}`)
			for i, want := range tc.codes {
				r, _ := newKeyRequest("198.51.100.21", nil)
				w, code := serve(h, r, okHandler)
				if code != want {
					t.Fatalf("request %d: %d, want %d", i, code, want)
				}
				if got := w.Header().Get("Retry-After"); code != 429 && got != tc.retry {
					t.Fatalf("request %d: Retry-After %q, want %q", i, got, tc.retry)
				}
				if has := w.Header().Get("RateLimit") != ""; has != tc.rlHeaders {
					t.Fatalf("request %d: rate-limit headers present=%v, want %v", i, has, tc.rlHeaders)
				}
			}
		})
	}
}

func TestRedisAndJWTBlocksParse(t *testing.T) {
	h, err := parseDirective(t, `rate_limit {
		zone z {
			key jwt_claim org.id
			rate 5/s
			store redis
			fail local
		}
		redis {
			addresses 127.0.0.1:7000 127.0.0.1:7001
			master_name mymaster
			username u
			password {env.REDIS_PASSWORD}
			sentinel_username su
			sentinel_password {env.SENTINEL_PASSWORD}
			tls insecure_skip_verify
			timeout 10ms
			pool_size 20
			key_prefix fg:
		}
		jwt {
			secret {env.JWT_SECRET}
			issuer https://issuer.example
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	r := h.Redis
	if len(r.Addresses) != 2 || r.MasterName != "mymaster" || r.Username != "u" || r.Password != "{env.REDIS_PASSWORD}" ||
		r.SentinelUsername != "su" || r.SentinelPassword != "{env.SENTINEL_PASSWORD}" || !r.TLS ||
		!r.InsecureSkipVerify || r.PoolSize != 20 || r.KeyPrefix != "fg:" || r.Timeout == 0 {
		t.Fatalf("redis block parsed as %+v", r)
	}
	if z := h.RateLimits["z"]; z.Key != "{jwt.org.id}" || z.Store != "redis" || z.Fail != "local" {
		t.Fatalf("zone parsed as %+v", z)
	}
	if h.JWT == nil {
		t.Fatal("jwt block lost")
	}
	t.Setenv("SENTINEL_PASSWORD", "from-env")
	if got := r.resolved(); got.SentinelUsername != "su" || got.SentinelPassword != "from-env" {
		t.Errorf("sentinel credentials resolved as %q, %q", got.SentinelUsername, got.SentinelPassword)
	}
}

func TestRedisConfigErrorsNameLine(t *testing.T) {
	runParseErrorCases(t, []parseErrorCase{
		{"store redis without block", "rate_limit {\n zone a {\n  rate 1/s\n  store redis\n }\n}", []string{"zone a: ", "redis block", ":2"}},
		{"unknown redis option", "rate_limit {\n zone a {\n  rate 1/s\n }\n redis {\n  url redis://127.0.0.1:6379\n  flavour cherry\n }\n}", []string{"flavour", ":7"}},
		{"bad url", "rate_limit {\n zone a {\n  rate 1/s\n }\n redis {\n  url http://nope\n }\n}", []string{"url", ":6"}},
		{"no address", "rate_limit {\n zone a {\n  rate 1/s\n }\n redis {\n  timeout 1s\n }\n}", []string{"redis: url, addresses or shards is required", ":5"}},
		{"sentinel_password without master_name", "rate_limit {\n zone a {\n  rate 1/s\n }\n redis {\n  addresses 127.0.0.1:26379\n  sentinel_password s\n }\n}", []string{"redis: ", "master_name", ":5"}},
		{"fail on memory", "rate_limit {\n zone a {\n  rate 1/s\n  fail closed\n }\n}", []string{"zone a: ", "fail", ":2"}},
		{"bad fail mode", "rate_limit {\n zone a {\n  rate 1/s\n  store redis\n  fail maybe\n }\n redis {\n  url redis://127.0.0.1:1\n }\n}", []string{"zone a: ", "fail", ":2"}},
		{"jwt_claim without jwt", "rate_limit {\n zone a {\n  key jwt_claim sub\n  rate 1/s\n }\n}", []string{"zone a: ", "jwt", ":2"}},
		{"tier without values", "rate_limit {\n zone a {\n  rate 1/s\n  tier {plan} {\n  }\n }\n}", []string{"tier", ":5"}},
		{"tier bad rate", "rate_limit {\n zone a {\n  rate 1/s\n  tier {plan} {\n   pro lots\n  }\n }\n}", []string{"zone a: option 'tier': value 'pro': want <events>/<duration>", ":5"}},
		{"tier cost too high", "rate_limit {\n zone a {\n  rate 5/s\n  cost 3\n  tier {plan} {\n   free 2/s\n  }\n }\n}", []string{"zone a: ", "cost", ":2"}},
	})
}
