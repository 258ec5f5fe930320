package docpages

import (
	"slices"
	"testing"
)

// TestSlug: anchors as GitHub gives them to headings of these pages.
func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Compatibility with mholt/caddy-ratelimit":              "compatibility-with-mholtcaddy-ratelimit",
		"The near cache: leases and the denial cache":           "the-near-cache-leases-and-the-denial-cache",
		"A client's own status":                                 "a-clients-own-status",
		"How keys are named: key_secret":                        "how-keys-are-named-key_secret",
		"The `rate_limit` directive":                            "the-rate_limit-directive",
		"Servers that refuse TIME in scripts":                   "servers-that-refuse-time-in-scripts",
		"When Redis fails: timeout, fail modes and the breaker": "when-redis-fails-timeout-fail-modes-and-the-breaker",
		"See [the design](design.md)":                           "see-the-design",
		"Quota in the headers  ":                                "quota-in-the-headers",
		"Owing: charges past the limit":                         "owing-charges-past-the-limit",
	} {
		if got := Slug(heading); got != want {
			t.Errorf("Slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestPage: blocks with their info strings and lines, anchors (a repeated
// heading numbered), and links, a link's text over two lines included;
// what a fenced block or inline code holds is neither a heading nor a
// link.
func TestPage(t *testing.T) {
	p := Page{Path: "docs/x.md", Text: "# Title\n\nSee [the\nnear cache](near-cache.md#leases) and `[not](a-link)`.\n\n" +
		"```caddyfile syntax\n# not a heading [nor](a-link)\nrate_limit\n```\n\n## Title\n\n![chart](c.svg)\n```\n```\n"}
	blocks := p.Blocks()
	if len(blocks) != 2 || blocks[0].Info != "caddyfile syntax" || blocks[0].Lang() != "caddyfile" || blocks[0].Line != 6 ||
		blocks[0].Text != "# not a heading [nor](a-link)\nrate_limit\n" || blocks[1].Text != "" {
		t.Errorf("blocks: %+v", blocks)
	}
	anchors := p.Anchors()
	if len(anchors) != 2 || !anchors["title"] || !anchors["title-1"] {
		t.Errorf("anchors: %v", anchors)
	}
	want := []Link{{"near-cache.md#leases", 3}, {"c.svg", 13}}
	if got := p.Links(); !slices.Equal(got, want) {
		t.Errorf("links: %v, want %v", got, want)
	}
}
