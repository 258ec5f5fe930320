package limiter

import "strings"

// StateID names the state of one limit of a zone: the zone's own (tier "")
// or one tier's, which is always kept apart. Every store keys its state by
// it (the Redis store in its key names, the Caddy adapter in the pool that
// keeps memory stores across reloads), so the two can never disagree on
// what is one limit. The characters that would open or close a Redis
// Cluster hash tag, the tier separator and the escape character itself are
// escaped, so no zone or tier name can collide with another's or move a key
// to another hash slot.
func StateID(zone, tier string) string {
	id := EscapeKeyPart(zone)
	if tier != "" {
		id += "#tier=" + EscapeKeyPart(tier)
	}
	return id
}

// OverrideStateID names the state of a zone's override limits (runtime
// overrides set through the admin API), apart from the zone's own limit
// and every tier's: "#override" cannot be written by a tier, whose '#' is
// escaped. Two override limits of one zone differ in their policy, which
// the stores' keys carry too.
func OverrideStateID(zone string) string {
	return EscapeKeyPart(zone) + "#override"
}

// keyPartEscapes percent-encodes what EscapeKeyPart must.
var keyPartEscapes = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D", "#", "%23")

// EscapeKeyPart percent-encodes a part of a key name: an operator's prefix,
// a zone or a tier name.
func EscapeKeyPart(s string) string {
	if !strings.ContainsAny(s, "{}%#") {
		return s
	}
	return keyPartEscapes.Replace(s)
}
