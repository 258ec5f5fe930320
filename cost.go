package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Cost is a zone's cost per request as configured: a whole number of
// units, or a template with placeholders evaluated per request. JSON takes
// a number (2) or a string ("{http.request.header.X-Batch-Size}"); it is
// written back the same way, so `caddy adapt` shows a constant as a number.
type Cost string

// UnmarshalJSON takes a number or a string.
func (c *Cost) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("cost: %w", err)
		}
		*c = Cost(s)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("cost: want an integer or a placeholder, got %s", b)
	}
	*c = Cost(strconv.FormatInt(n, 10))
	return nil
}

// MarshalJSON writes a constant cost as a number, a template as a string.
func (c Cost) MarshalJSON() ([]byte, error) {
	if n, err := strconv.ParseInt(string(c), 10, 64); err == nil {
		return strconv.AppendInt(nil, n, 10), nil
	}
	return json.Marshal(string(c))
}

// isTemplate reports whether the cost is evaluated per request.
func (c Cost) isTemplate() bool { return strings.Contains(string(c), "{") }

// constant is the cost of every request when it is not a template: 1 when
// unset (or 0, which JSON configs have always meant as unset).
func (c Cost) constant() (int64, error) {
	if c == "" || c.isTemplate() {
		return 1, nil
	}
	n, err := strconv.ParseInt(string(c), 10, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("cost must be a positive integer or a placeholder, got %q", string(c))
	case n < 0:
		return 0, fmt.Errorf("cost must be positive, got %d", n)
	case n == 0:
		return 1, nil
	}
	return n, nil
}

// template compiles a per-request cost. Its values are taken as typed: no
// IP grouping, which keys have.
func (c Cost) template() (*keyTemplate, error) {
	t, err := parseKeyTemplate(string(c))
	if err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	t.ipv4Bits, t.ipv6Bits = 32, 128
	return &t, nil
}

// ResponseCost learns a request's real cost from its response. The
// up-front cost (Zone.Cost, default 1) is what admission needs and takes;
// once the response is written, the integer value of Header (a header,
// or a trailer sent after the body) is the request's cost, and the
// difference is taken, past the limit if need be (the key then owes, and
// its requests are refused until time repays it), or given back. A value
// above the limit's quota counts as the quota. A missing or invalid value
// leaves the up-front cost, and is counted in the
// response_costs_total metric.
type ResponseCost struct {
	// Header is the response header or trailer that carries the cost.
	Header string `json:"header"`
	// Keep passes the header on to the client; by default it is removed.
	Keep bool `json:"keep,omitempty"`

	// field is Header in canonical form, as a response header map keys
	// it; trailerField is how a trailer of that name is set after the
	// body (http.TrailerPrefix + field).
	field, trailerField string
}

// validate refuses a header name that no response could carry.
func (rc *ResponseCost) validate() error {
	if rc.Header == "" {
		return errors.New("response_cost needs a header name")
	}
	for i := 0; i < len(rc.Header); i++ {
		if !isTokenChar(rc.Header[i]) {
			return fmt.Errorf("response_cost: %q is not a header field name", rc.Header)
		}
	}
	return nil
}

// isTokenChar reports whether c may appear in an HTTP field name (RFC 9110
// token).
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// validateCountResponse refuses a response matcher with a status that is
// neither a class (1 to 5) nor a code (100 to 599).
func validateCountResponse(m *caddyhttp.ResponseMatcher) error {
	if len(m.StatusCode) == 0 && len(m.Headers) == 0 {
		return errors.New("count_response needs a status or a header to match")
	}
	for _, code := range m.StatusCode {
		if !(code >= 1 && code <= 5) && !(code >= 100 && code <= 599) {
			return fmt.Errorf("count_response: status %d is neither a code (100-599) nor a class (1-5, 2xx-5xx)", code)
		}
	}
	return nil
}

// errBadCost refuses a request whose cost placeholder gives no usable
// value; the message names neither the value nor the key.
type errBadCost struct{ max int64 }

func (e errBadCost) Error() string {
	return fmt.Sprintf("request cost must be an integer from 0 to %d", e.max)
}

// requestCost is c's cost for r: the zone's constant, or its template's
// value, which must be an integer from 0 to the limit's largest cost. A
// value outside that range refuses the request with 400, never admits it
// free.
func (h *Handler) requestCost(r *http.Request, repl *caddy.Replacer, claims *jwtClaims, c *zoneRecord) error {
	z := c.zone
	if z.costTemplate == nil {
		c.cost = z.cost
		return nil
	}
	v, _ := z.costTemplate.evaluate(r, repl, claims)
	limit := c.limit.maxCost
	n, err := strconv.ParseInt(v, 10, 64)
	if err == nil && n >= 0 && n <= limit {
		c.cost = n
		if n == 0 && c.limit.traits.ReleasesOnFinish {
			// A concurrency request always holds a slot while it
			// runs: a cost of 0 would take none, and any client could
			// run as many at once as it liked.
			c.cost = 1
		}
		return nil
	}
	bad := errBadCost{max: limit}
	if ce := h.logger.Check(zapcore.DebugLevel, "request cost refused"); ce != nil {
		ce.Write(zap.String("zone", z.name), zap.Int("value_length", len(v)), zap.Int64("max", limit))
	}
	return caddyhttp.Error(http.StatusBadRequest, bad)
}
