package ratelimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// clientIPPlaceholder is Caddy's client IP, which honours the server's
// trusted_proxies. The Caddyfile shorthand {client_ip} expands to it.
const clientIPPlaceholder = "http.vars.client_ip"

// missingKeyNamespace prefixes the client IP that stands in for a missing
// key, so such requests never share a limit with a key that happens to
// equal an IP address. Evaluated keys never start with a NUL followed by
// anything but NUL (see escapeKey), so no client can reach this namespace.
const missingKeyNamespace = "\x00missing-key\x00"

// escapeKey keeps client-derived keys out of the namespaces the handler
// reserves: a key that starts with NUL (a query value can carry %00) gets
// a second NUL in front, which no reserved key has.
func escapeKey(k string) string {
	if k != "" && k[0] == 0 {
		return "\x00" + k
	}
	return k
}

// maxTemplateLength bounds a key template as written. Evaluated keys are
// hashed whatever their length; the bound only refuses absurd configs.
const maxTemplateLength = 4096

// keyTemplate is a zone key compiled into literals and placeholders, so a
// request's key is built without re-parsing the template.
type keyTemplate struct {
	parts []keyPart
	// ipv4Bits and ipv6Bits mask placeholder values that are IP addresses.
	ipv4Bits, ipv6Bits int
}

// keyPart is a literal, or a placeholder name when placeholder is set.
// claim is set, when the template is parsed, for a {jwt.*} placeholder,
// whose claim path is the text after "jwt.": requests need not look at
// the name again.
type keyPart struct {
	text        string
	placeholder bool
	claim       bool
	// header is, for {http.request.header.<field>}, the field in canonical
	// form, read from the request as the replacer would read it.
	header string
}

// parseKeyTemplate compiles a key; empty means the client IP. Braces
// escaped with a backslash are literal, as in Caddy's replacer.
func parseKeyTemplate(s string) (keyTemplate, error) {
	if s == "" {
		s = "{" + clientIPPlaceholder + "}"
	}
	if len(s) > maxTemplateLength {
		return keyTemplate{}, fmt.Errorf("key is longer than %d bytes", maxTemplateLength)
	}
	var t keyTemplate
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, keyPart{text: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && i+1 < len(s) && (s[i+1] == '{' || s[i+1] == '}'):
			lit.WriteByte(s[i+1])
			i++
		case c == '{':
			end := strings.IndexByte(s[i+1:], '}')
			if end < 0 {
				return keyTemplate{}, fmt.Errorf("unclosed placeholder in %q", s)
			}
			name := s[i+1 : i+1+end]
			if name == "" || strings.ContainsAny(name, "{ ") {
				return keyTemplate{}, fmt.Errorf("malformed placeholder {%s} in %q", name, s)
			}
			flush()
			part := keyPart{text: name, placeholder: true, claim: strings.HasPrefix(name, "jwt.")}
			if field, ok := strings.CutPrefix(name, requestHeaderPrefix); ok && field != "" {
				part.header = textproto.CanonicalMIMEHeaderKey(field)
			}
			t.parts = append(t.parts, part)
			i += end + 1
		case c == '}':
			return keyTemplate{}, fmt.Errorf("unopened } in %q", s)
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	if len(t.parts) == 0 {
		return keyTemplate{}, errors.New("empty key")
	}
	return t, nil
}

// evaluate builds r's key. It reports false when any placeholder is empty
// or unknown: a key missing a part is a missing key, never a shared bucket.
// claims are the request's verified token (see value), or nil.
func (t *keyTemplate) evaluate(r *http.Request, repl *caddy.Replacer, claims *jwtClaims) (string, bool) {
	if len(t.parts) == 1 {
		p := t.parts[0]
		if !p.placeholder {
			return p.text, true
		}
		v := t.value(r, repl, claims, p)
		return escapeKey(v), v != ""
	}
	var buf [128]byte
	key := buf[:0]
	for _, p := range t.parts {
		if !p.placeholder {
			key = append(key, p.text...)
			continue
		}
		v := t.value(r, repl, claims, p)
		if v == "" {
			return "", false
		}
		key = append(key, v...)
	}
	return escapeKey(string(key)), true
}

// value is one placeholder's value, grouped by prefix if it is an IP. A
// {jwt.*} claim is read from claims, the request's token as the handler's
// own jwt block verified it, when the handler has one: what the replacer
// would answer, without asking Caddy's providers first or boxing the value.
func (t *keyTemplate) value(r *http.Request, repl *caddy.Replacer, claims *jwtClaims, p keyPart) string {
	if p.text == clientIPPlaceholder {
		return t.clientIP(r)
	}
	if p.claim && claims != nil {
		return t.maskIP(claims.claim(p.text[len("jwt."):]))
	}
	if p.header != "" {
		return t.maskIP(requestHeader(r, p.header))
	}
	v, _ := repl.GetString(p.text)
	return t.maskIP(v)
}

// requestHeaderPrefix starts Caddy's request header placeholders.
const requestHeaderPrefix = "http.request.header."

// requestHeader is what {http.request.header.<field>} gives for r, field
// in canonical form: its values joined by commas. Read here, it skips the
// replacer's providers and the boxing of the value.
func requestHeader(r *http.Request, field string) string {
	vals := r.Header[field]
	switch len(vals) {
	case 0:
		return ""
	case 1:
		return vals[0]
	}
	return strings.Join(vals, ",")
}

// typed is the key the zone evaluates for a request whose placeholders
// give the value an operator typed (admin inspect and reset): a bare IP
// address is grouped by prefix, so a client's full address names its
// prefix's state, and the value is escaped as evaluate escapes it. A
// template without placeholders is one constant key, taken as typed. In a
// composite template (`{client_ip}:{path}`) only a key that is an IP as a
// whole is masked: type the IP part as the zone groups it.
func (t *keyTemplate) typed(v string) string {
	if len(t.parts) == 1 && !t.parts[0].placeholder {
		return v
	}
	return escapeKey(t.maskIP(v))
}

// typedPrefix is the prefix of the keys the zone evaluates that starts
// every key whose value starts with p as typed: escaped as evaluate
// escapes keys (a key that starts with NUL gets another in front, and so
// does a prefix), never masked (a prefix is not an address; the keys it
// is matched against are, grouped by the zone's prefix lengths). A
// template without placeholders takes it as typed, as typed does.
func (t *keyTemplate) typedPrefix(p string) string {
	if len(t.parts) == 1 && !t.parts[0].placeholder {
		return p
	}
	return escapeKey(p)
}

// clientIP is Caddy's client IP for r, grouped by prefix.
func (t *keyTemplate) clientIP(r *http.Request) string {
	ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if ip == "" {
		ip = r.RemoteAddr
		if host, _, err := net.SplitHostPort(ip); err == nil {
			ip = host
		}
	}
	return t.maskIP(ip)
}

// maskIP groups an IP address to the zone's prefix lengths; any other
// value is returned unchanged.
func (t *keyTemplate) maskIP(v string) string {
	if t.ipv4Bits >= 32 && strings.IndexByte(v, ':') < 0 {
		// Not IPv6, so an IPv4 address kept whole or no address at all:
		// either way v as it is (the common case, so no parse).
		return v
	}
	if !maybeIP(v) {
		return v
	}
	addr, err := netip.ParseAddr(v)
	if err != nil {
		return v
	}
	if addr.Is4() && t.ipv4Bits >= 32 {
		return v // dotted decimal parses only in its canonical form
	}
	addr = addr.WithZone("")
	bits := t.ipv6Bits
	if addr.Is4In6() || addr.Is4() {
		addr, bits = addr.Unmap(), t.ipv4Bits
	}
	if bits <= 0 || bits >= addr.BitLen() {
		return addr.String()
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return v
	}
	return p.Addr().String()
}

// maybeIP cheaply rules out values that cannot be IP addresses, so API keys
// and paths never pay for a failed parse.
func maybeIP(v string) bool {
	if len(v) < 2 || len(v) > 64 {
		return false
	}
	sep := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '.' || c == ':':
			sep = true
		case c == '%':
			return sep
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
		default:
			return false
		}
	}
	return sep
}
