package limiter

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// A prefix override applies to every key that starts with its prefix
// (keys built like "{tenant}:{user}": "acme:" names every user of one
// tenant). It is kept in its zone's set beside the exact keys' overrides,
// under a name no key has (PrefixOverrideName), so a set holds both,
// and every writer, store, message and load carries prefix overrides as
// it carries exact ones. The table indexes them in a byte trie, read
// without a lock (see prefixNode).

// prefixMark starts the name of a prefix override in its zone's set. A
// key a zone evaluates never starts with it: one that starts with NUL
// gets a second NUL in front (the adapter's escapeKey), and the adapter's
// one reserved namespace starts otherwise. An older build reading a set
// that holds one takes it for the override of a key that never comes,
// and so applies nothing. The mark alone (an empty prefix, which no
// override may have) names the count of the set's prefix overrides in
// Redis (redisstore).
const prefixMark = "\x00prefix\x00"

// PrefixCountField is the field of a redis zone's set that counts its
// prefix overrides: the name an empty prefix would have, which none has.
const PrefixCountField = prefixMark

// MaxPrefixOverrides bounds how many prefix overrides one zone holds,
// so its trie stays small and every instance builds it quickly.
const MaxPrefixOverrides = 10_000

// MaxOverrideNameLen bounds the name under which an override is kept:
// a key's, or a prefix's with its mark.
const MaxOverrideNameLen = MaxOverrideKeyLen + len(prefixMark)

// ErrTooManyPrefixOverrides is wrapped by the error of a write of a new
// prefix override when the zone holds MaxPrefixOverrides already.
var ErrTooManyPrefixOverrides = errors.New("too many prefix overrides")

// PrefixOverrideName is the name under which the override of prefix p
// is kept in its zone's set.
func PrefixOverrideName(p string) string { return prefixMark + p }

// OverridePrefix returns the prefix an override's name holds, and
// whether it is a prefix override's name at all.
func OverridePrefix(name string) (string, bool) {
	return strings.CutPrefix(name, prefixMark)
}

// CheckOverrideName refuses a name no override may be kept under: an
// empty key or prefix ("" is a redis set's version, and an empty prefix
// would be every key: the zone's own limit), or a key or prefix longer
// than MaxOverrideKeyLen.
func CheckOverrideName(name string) error {
	key, isPrefix := OverridePrefix(name)
	what := "key"
	if isPrefix {
		what = "prefix"
	}
	switch {
	case key == "":
		return fmt.Errorf("empty %s", what)
	case len(key) > MaxOverrideKeyLen:
		return fmt.Errorf("%s of %d bytes, longer than %d", what, len(key), MaxOverrideKeyLen)
	}
	return nil
}

// prefixNode is one node of a table's prefix trie: a radix tree over
// bytes, each edge holding the run of bytes no other prefix branches
// from. Nodes are never changed once published: a write builds the nodes
// on the path it changes afresh and publishes the new root with one
// atomic store (OverrideTable.prefixes), so requests read it without a
// lock while an admin write runs. A lookup walks one node per branching
// byte of the key: a key that no prefix starts like leaves at the root,
// after one look through its firsts.
type prefixNode struct {
	// label is the edge into this node, after the byte that chose it in
	// the parent's firsts.
	label string
	// has says this node ends a prefix, prefix, whose override is o.
	has    bool
	prefix string
	o      Override
	// firsts holds the first byte of each child's edge, kids[i] the child
	// whose edge starts with firsts[i].
	firsts string
	kids   []*prefixNode
}

// longest returns the node of the longest prefix of key held under n (a
// root) that is at most most bytes long, or nil.
func (n *prefixNode) longest(key string, most int) *prefixNode {
	var best *prefixNode
	for i := 0; ; {
		if n.has {
			best = n
		}
		if i >= len(key) || i >= most {
			return best
		}
		// A plain loop, not strings.IndexByte: firsts is short, and the
		// call's setup cost more than the loop (BENCHMARKS.md, "Header
		// families and prefix overrides").
		j, b := 0, key[i]
		for j < len(n.firsts) && n.firsts[j] != b {
			j++
		}
		if j == len(n.firsts) {
			return best
		}
		c := n.kids[j]
		end := i + 1 + len(c.label)
		if end > len(key) || end > most || key[i+1:end] != c.label {
			return best
		}
		n, i = c, end
	}
}

// with is n with prefix p's override o, where rest is what of p lies
// below n: the nodes from n down to p's are new, the rest shared.
func (n *prefixNode) with(rest, p string, o Override) *prefixNode {
	c := *n
	if rest == "" {
		c.has, c.prefix, c.o = true, p, o
		return &c
	}
	j := strings.IndexByte(n.firsts, rest[0])
	if j < 0 {
		c.firsts = n.firsts + rest[:1]
		c.kids = append(slices.Clip(n.kids), &prefixNode{label: rest[1:], has: true, prefix: p, o: o})
		return &c
	}
	k, r := n.kids[j], rest[1:]
	cp := commonPrefixLen(r, k.label)
	var nk *prefixNode
	if cp == len(k.label) {
		nk = k.with(r[cp:], p, o)
	} else {
		// p branches inside k's edge: a node where it does, above k.
		lower := *k
		lower.label = k.label[cp+1:]
		mid := &prefixNode{label: k.label[:cp], firsts: k.label[cp : cp+1], kids: []*prefixNode{&lower}}
		nk = mid.with(r[cp:], p, o)
	}
	c.kids = slices.Clone(n.kids)
	c.kids[j] = nk
	return &c
}

// without is n without the prefix of which rest lies below n, and
// whether it held it. A node left with neither a prefix nor children is
// dropped (nil), and one left with one child and no prefix merges into
// it, so the trie stays as a fresh build would make it; the root (root
// set) is kept whatever it holds.
func (n *prefixNode) without(rest string, root bool) (*prefixNode, bool) {
	c := *n
	if rest == "" {
		if !n.has {
			return n, false
		}
		c.has, c.prefix, c.o = false, "", Override{}
	} else {
		j := strings.IndexByte(n.firsts, rest[0])
		if j < 0 {
			return n, false
		}
		k, r := n.kids[j], rest[1:]
		if !strings.HasPrefix(r, k.label) {
			return n, false
		}
		nk, had := k.without(r[len(k.label):], false)
		if !had {
			return n, false
		}
		if nk == nil {
			c.firsts = n.firsts[:j] + n.firsts[j+1:]
			c.kids = slices.Delete(slices.Clone(n.kids), j, j+1)
		} else {
			c.kids = slices.Clone(n.kids)
			c.kids[j] = nk
		}
	}
	if root || c.has {
		return &c, true
	}
	switch len(c.kids) {
	case 0:
		return nil, true
	case 1:
		merged := *c.kids[0]
		merged.label = c.label + c.firsts + merged.label
		return &merged, true
	}
	return &c, true
}

// prefixEntry is one prefix with its override, for buildPrefixes.
type prefixEntry struct {
	prefix string
	o      Override
}

// buildPrefixes builds the trie of all (distinct, none empty) from
// scratch; nil for none. Sorted, the prefixes that share a child share a
// run, whose common prefix (of its first and last) is the child's edge.
func buildPrefixes(all []prefixEntry) *prefixNode {
	if len(all) == 0 {
		return nil
	}
	slices.SortFunc(all, func(a, b prefixEntry) int { return strings.Compare(a.prefix, b.prefix) })
	root := &prefixNode{}
	buildBelow(root, all, 0)
	return root
}

// buildBelow gives n, at depth d (the length of every prefix of all down
// to n), the prefixes of all, sorted.
func buildBelow(n *prefixNode, all []prefixEntry, d int) {
	if len(all[0].prefix) == d {
		n.has, n.prefix, n.o = true, all[0].prefix, all[0].o
		all = all[1:]
	}
	for len(all) > 0 {
		b := all[0].prefix[d]
		end := 1
		for end < len(all) && all[end].prefix[d] == b {
			end++
		}
		run := all[:end]
		first, last := run[0].prefix[d+1:], run[len(run)-1].prefix[d+1:]
		label := first[:commonPrefixLen(first, last)]
		k := &prefixNode{label: label}
		buildBelow(k, run, d+1+len(label))
		n.firsts += all[0].prefix[d : d+1]
		n.kids = append(n.kids, k)
		all = all[end:]
	}
}

// commonPrefixLen is the length of the longest common prefix of a and b.
func commonPrefixLen(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
