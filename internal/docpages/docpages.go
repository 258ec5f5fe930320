// Package docpages reads the operator documentation, README.md and the
// pages under docs/, as the tests that hold it to the code need it: its
// fenced blocks (so every config in it is adapted by a test, and every
// example under examples/ is shown whole), its headings as the anchors
// GitHub gives them, and its links (so none points at a page or section
// that is gone). It knows Markdown only as far as these pages write it.
package docpages

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Page is one Markdown file: its path relative to the module root, with
// forward slashes (README.md, docs/redis.md), and its text.
type Page struct {
	Path string
	Text string
}

// Read returns README.md and every docs/*.md of the module rooted at
// root, README.md first, the others by name.
func Read(root string) ([]Page, error) {
	paths := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	slices.Sort(more)
	for _, p := range more {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return nil, err
		}
		paths = append(paths, filepath.ToSlash(rel))
	}
	var pages []Page
	for _, p := range paths {
		text, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			return nil, fmt.Errorf("reading the docs: %w", err)
		}
		pages = append(pages, Page{Path: p, Text: string(text)})
	}
	return pages, nil
}

// Block is a fenced code block: the words after its opening fence (Info;
// "caddyfile", "caddyfile syntax", "sh"), its text up to the closing
// fence, each line ending in a newline, and the line of its opening fence
// (from 1).
type Block struct {
	Info string
	Text string
	Line int
}

// Lang is the first word of the block's info string, the language GitHub
// highlights it as.
func (b Block) Lang() string {
	lang, _, _ := strings.Cut(b.Info, " ")
	return lang
}

// Blocks are the page's fenced blocks, opened and closed by ``` at the
// start of a line, in order.
func (p Page) Blocks() []Block {
	var out []Block
	var cur *Block
	for i, line := range strings.Split(p.Text, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &Block{Info: strings.TrimSpace(strings.TrimPrefix(line, "```")), Line: i + 1}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.Text += line + "\n"
		}
	}
	return out
}

// prose is the page's text with every fenced block's lines blanked, so
// what looks like a heading or a link inside a block is not taken for one
// while line numbers stay those of the page.
func (p Page) prose() []string {
	lines := strings.Split(p.Text, "\n")
	in := false
	for i, line := range lines {
		fence := strings.HasPrefix(line, "```") && (!in || strings.TrimSpace(line) == "```")
		if in || fence {
			lines[i] = ""
		}
		if fence {
			in = !in
		}
	}
	return lines
}

// Anchors are the fragments GitHub gives the page's headings (see Slug),
// a repeated one numbered from its second as GitHub does: "x", "x-1".
func (p Page) Anchors() map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range p.prose() {
		hashes := len(line) - len(strings.TrimLeft(line, "#"))
		if hashes == 0 || hashes > 6 || !strings.HasPrefix(line[hashes:], " ") {
			continue
		}
		slug := Slug(line[hashes+1:])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

var (
	inlineCodeRE = regexp.MustCompile("`[^`]*`")
	linkRE       = regexp.MustCompile(`!?\[([^\]]*)\]\(([^)\s]+)\)`)
)

// Slug is the anchor GitHub gives a heading of this text: the text as
// rendered (links by their text, code without its backticks), lower
// case, without any character but letters, digits, spaces, hyphens and
// underscores, each space a hyphen. "Compatibility with
// mholt/caddy-ratelimit" is compatibility-with-mholtcaddy-ratelimit.
func Slug(heading string) string {
	text := linkRE.ReplaceAllString(strings.TrimSpace(heading), "$1")
	text = strings.ReplaceAll(text, "`", "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Link is a Markdown link or image of the page's prose: its target as
// written and the line (from 1) its text begins on.
type Link struct {
	Target string
	Line   int
}

// Links are the page's inline links and images, outside fenced blocks and
// inline code; a link's text may run over lines.
func (p Page) Links() []Link {
	text := strings.Join(p.prose(), "\n")
	// Inline code is blanked but for its line breaks, so offsets keep
	// their lines.
	text = inlineCodeRE.ReplaceAllStringFunc(text, func(code string) string {
		return strings.Repeat("\n", strings.Count(code, "\n"))
	})
	var out []Link
	for _, m := range linkRE.FindAllStringSubmatchIndex(text, -1) {
		out = append(out, Link{Target: text[m[4]:m[5]], Line: strings.Count(text[:m[0]], "\n") + 1})
	}
	return out
}
