package ratelimit

import (
	"strings"
	"testing"
)

func mustTemplate(t testing.TB, s string, v4, v6 int) keyTemplate {
	t.Helper()
	k, err := parseKeyTemplate(s)
	if err != nil {
		t.Fatal(err)
	}
	k.ipv4Bits, k.ipv6Bits = v4, v6
	return k
}

func TestKeyEvaluation(t *testing.T) {
	for _, tc := range []struct {
		template string
		ip       string
		headers  map[string]string
		want     string
		ok       bool
	}{
		{"", "203.0.113.9", nil, "203.0.113.9", true},
		{"{http.vars.client_ip}", "2001:db8:1:2:3:4:5:6", nil, "2001:db8:1:2::", true},
		{"{http.request.header.X-API-Key}", "203.0.113.9", map[string]string{"X-API-Key": "k1"}, "k1", true},
		{"{http.request.header.X-API-Key}", "203.0.113.9", nil, "", false},
		{"{http.vars.client_ip}:{http.request.uri.path}", "203.0.113.9", nil, "203.0.113.9:/api/items", true},
		{"{http.request.header.X-API-Key}:{http.request.uri.path}", "203.0.113.9", nil, "", false},
		{"global", "203.0.113.9", nil, "global", true},
		{`lit\{x\}{http.request.header.A}`, "203.0.113.9", map[string]string{"A": "v"}, "lit{x}v", true},
		{"{http.request.header.X-Real-IP}", "203.0.113.9", map[string]string{"X-Real-IP": "2001:db8::1"}, "2001:db8::", true},
		{"{no.such.placeholder}", "203.0.113.9", nil, "", false},
	} {
		r, repl := newKeyRequest(tc.ip, tc.headers)
		k := mustTemplate(t, tc.template, 32, 64)
		got, ok := k.evaluate(r, repl, nil)
		if got != tc.want || ok != tc.ok {
			t.Errorf("key %q: got %q,%v want %q,%v", tc.template, got, ok, tc.want, tc.ok)
		}
	}
}

// TestKeysCannotReachReservedNamespace checks a client-chosen key that
// spells the missing-key namespace (a query value can carry NUL) does not
// share the stand-in bucket of that IP.
func TestKeysCannotReachReservedNamespace(t *testing.T) {
	spoof := missingKeyNamespace + "203.0.113.9"
	r, repl := newKeyRequest("203.0.113.9", map[string]string{"X-K": spoof})
	k := mustTemplate(t, "{http.request.header.X-K}", 32, 64)
	got, ok := k.evaluate(r, repl, nil)
	if !ok || got == spoof || strings.HasPrefix(got, missingKeyNamespace) {
		t.Fatalf("client key %q evaluated to %q, inside the reserved namespace", spoof, got)
	}
	k2 := mustTemplate(t, "x{http.request.header.X-K}", 32, 64)
	if got, _ := k2.evaluate(r, repl, nil); strings.HasPrefix(got, missingKeyNamespace) {
		t.Fatalf("composite key reached the reserved namespace: %q", got)
	}
}

func TestMaskIP(t *testing.T) {
	for _, tc := range []struct {
		in     string
		v4, v6 int
		want   string
	}{
		{"192.0.2.77", 32, 64, "192.0.2.77"},
		{"192.0.2.77", 24, 64, "192.0.2.0"},
		{"::ffff:192.0.2.77", 24, 64, "192.0.2.0"},
		{"::ffff:192.0.2.77", 32, 64, "192.0.2.77"},
		{"2001:db8:aaaa:bbbb:1:2:3:4", 32, 64, "2001:db8:aaaa:bbbb::"},
		{"2001:db8:aaaa:bbbb:ffff:2:3:4", 32, 64, "2001:db8:aaaa:bbbb::"},
		{"2001:db8:aaaa:bbbb:1:2:3:4", 32, 128, "2001:db8:aaaa:bbbb:1:2:3:4"},
		{"2001:DB8::1", 32, 128, "2001:db8::1"},
		{"fe80::1%eth0", 32, 128, "fe80::1"},
		{"not-an-ip", 8, 8, "not-an-ip"},
		{"deadbeef", 8, 8, "deadbeef"},
		{"1.2.3", 8, 8, "1.2.3"},
	} {
		k := keyTemplate{ipv4Bits: tc.v4, ipv6Bits: tc.v6}
		if got := k.maskIP(tc.in); got != tc.want {
			t.Errorf("maskIP(%q, /%d, /%d) = %q, want %q", tc.in, tc.v4, tc.v6, got, tc.want)
		}
	}
}

func TestParseKeyTemplateErrors(t *testing.T) {
	for _, s := range []string{"{", "{}", "a}", "{a b}", "{a{b}}", strings.Repeat("x", maxTemplateLength+1)} {
		if _, err := parseKeyTemplate(s); err == nil {
			t.Errorf("parseKeyTemplate(%q) accepted", s)
		}
	}
}

// FuzzKeyExtraction feeds arbitrary templates and header values through the
// key path: it must never panic, and a missing key is never a key.
func FuzzKeyExtraction(f *testing.F) {
	f.Add("{http.request.header.X-API-Key}", "abc", "203.0.113.1")
	f.Add("{http.vars.client_ip}:{http.request.uri.path}", "", "2001:db8::1")
	f.Add(`\{{http.request.header.X-API-Key}\}`, "::ffff:1.2.3.4", "1.2.3.4")
	f.Add("{http.request.header.X-API-Key}", "fe80::1%"+strings.Repeat("z", 100), "bogus")
	f.Add("{{}}", "x", "")
	f.Fuzz(func(t *testing.T, template, header, ip string) {
		k, err := parseKeyTemplate(template)
		if err != nil {
			return
		}
		k.ipv4Bits, k.ipv6Bits = 24, 64
		r, repl := newKeyRequest(ip, nil)
		r.Header["X-Api-Key"] = []string{header}
		key, ok := k.evaluate(r, repl, nil)
		if !ok && key != "" {
			t.Fatalf("missing key %q returned a value", key)
		}
		_ = k.clientIP(r)
		_ = k.maskIP(header)
	})
}
