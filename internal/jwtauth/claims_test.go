package jwtauth

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

func TestLookupClaim(t *testing.T) {
	var claims Claims
	dec := json.NewDecoder(strings.NewReader(`{
		"sub": "alice", "empty": "", "n": 42, "big": 12345678901234567890, "f": 1.50,
		"e": 1e3, "neg": -0.0, "small": 1.5e-7, "exp": 2.5E+2, "t": true, "no": false,
		"null": null, "arr": [1], "obj": {"id": "o-1", "n": 7.0, "deep": {"x": "y"}},
		"https://ns.test/org": "acme", "a": {"b.c": "dotted"}
	}`))
	dec.UseNumber()
	if err := dec.Decode(&claims); err != nil {
		t.Fatal(err)
	}
	claims["float"] = 3.0
	claims["float_frac"] = 0.25
	claims["float_big"] = 1e21
	claims["nan"] = nan()
	claims["int"] = 7
	cases := []struct {
		path string
		want string
		ok   bool
	}{
		{"sub", "alice", true},
		{"empty", "", true},
		{"n", "42", true},
		{"big", "12345678901234567890", true},
		{"f", "1.5", true},
		{"e", "1000", true},
		{"neg", "0", true},
		{"small", "0.00000015", true},
		{"exp", "250", true},
		{"t", "true", true},
		{"no", "false", true},
		{"null", "", false},
		{"arr", "", false},
		{"obj", "", false},
		{"obj.id", "o-1", true},
		{"obj.n", "7", true},
		{"obj.deep.x", "y", true},
		{"obj.deep", "", false},
		{"obj.missing", "", false},
		{"sub.x", "", false},
		{"missing", "", false},
		{"", "", false},
		{".", "", false},
		{"obj.", "", false},
		{".obj", "", false},
		{"obj..id", "", false},
		{"https://ns.test/org", "acme", true},
		{"a.b.c", "", false},
		{"float", "3", true},
		{"float_frac", "0.25", true},
		{"float_big", "1000000000000000000000", true},
		{"nan", "", false},
		{"int", "7", true},
	}
	for _, tc := range cases {
		got, ok := claims.Lookup(tc.path)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Lookup(%q) = %q, %v; want %q, %v", tc.path, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := Claims(nil).Lookup("sub"); ok {
		t.Error("nil claims gave a value")
	}
	if got, ok := (Claims{"o": jwt.MapClaims{"x": "y"}}).Lookup("o.x"); !ok || got != "y" {
		t.Errorf("MapClaims nested: %q %v", got, ok)
	}
}

func nan() float64 {
	var zero float64
	return zero / zero
}

func TestRenderDecimal(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"0", "0", true},
		{"-0", "0", true},
		{"0.000", "0", true},
		{"-0e5", "0", true},
		{"10", "10", true},
		{"100e-2", "1", true},
		{"1.0", "1", true},
		{"-1.50", "-1.5", true},
		{"1E2", "100", true},
		{"1e+2", "100", true},
		{"123.456e1", "1234.56", true},
		{"123.456e-5", "0.00123456", true},
		{"0.001e3", "1", true},
		{"00012", "12", true},
		{"9007199254740993", "9007199254740993", true},
		{"1e400", "1" + strings.Repeat("0", 400), true},
		{"1e401", "", false},
		{"1e-400", "0." + strings.Repeat("0", 399) + "1", true},
		{"1e-402", "", false},
		{"1e999999999999999999", "", false},
		{"", "", false},
		{"-", "", false},
		{"1.", "", false},
		{".5", "", false},
		{"1e", "", false},
		{"1e+", "", false},
		{"+1", "", false},
		{"1x", "", false},
		{"NaN", "", false},
	}
	for _, tc := range cases {
		got, ok := renderDecimal(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("renderDecimal(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
