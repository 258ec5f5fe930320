package ratelimit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/docpages"
)

// TestDesignNamesExist keeps docs/design.md honest: every Go identifier it
// writes in backticks (a name such as `mustScripts`, a member such as
// `Store.Refund`, a call such as `admission()`, a qualified name of one of
// this module's packages such as `nearcache.Cache`) must be declared in
// the module's code, tests included. Operator words (`local_quota`), Redis
// commands (`TIME`), paths and other packages' names (`time.Now`) are not
// checked; a lower-case word (`burst`, `now`) passes if the code declares
// it or writes it in a string or a Lua script, since it may be either.
func TestDesignNamesExist(t *testing.T) {
	text, err := os.ReadFile("docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	code := readCodeNames(t, ".")
	for _, span := range designSpans(string(text)) {
		if why := code.missing(span); why != "" {
			t.Errorf("docs/design.md names `%s`: %s", span, why)
		}
	}
}

// codeNames is what the module's Go and Lua code declares and writes.
type codeNames struct {
	packages map[string]bool            // this module's package names
	declared map[string]bool            // every declared name: funcs, types, fields, methods, consts, vars
	members  map[string]map[string]bool // type name -> its fields and methods
	words    map[string]bool            // local names, words in string literals, Lua identifiers
	imports  map[string]bool            // names the code imports other packages by
}

var wordRE = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)

func readCodeNames(t *testing.T, root string) codeNames {
	t.Helper()
	c := codeNames{map[string]bool{}, map[string]bool{}, map[string]map[string]bool{}, map[string]bool{}, map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		switch filepath.Ext(path) {
		case ".lua":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			c.addWords(string(b))
		case ".go":
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			c.addFile(f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (c codeNames) addWords(s string) {
	for _, w := range wordRE.FindAllString(s, -1) {
		c.words[w] = true
	}
}

func (c codeNames) member(typ, name string) {
	if c.members[typ] == nil {
		c.members[typ] = map[string]bool{}
	}
	c.members[typ][name] = true
	c.declared[name] = true
}

func (c codeNames) addFile(f *ast.File) {
	c.packages[f.Name.Name] = true
	for _, imp := range f.Imports {
		// The name a package is imported by: its alias, else its path's
		// last element, without a major version (caddy/v2) or "go-"
		// (go-redis/v9 is package redis).
		elems := strings.Split(strings.Trim(imp.Path.Value, `"`), "/")
		name := elems[len(elems)-1]
		if len(elems) > 1 && regexp.MustCompile(`^v[0-9]+$`).MatchString(name) {
			name = elems[len(elems)-2]
		}
		name = strings.TrimPrefix(name, "go-")
		if imp.Name != nil {
			name = imp.Name.Name
		}
		c.imports[name] = true
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			c.declared[d.Name.Name] = true
			if d.Recv != nil && len(d.Recv.List) == 1 {
				c.member(receiverType(d.Recv.List[0].Type), d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					c.declared[s.Name.Name] = true
					c.addMembers(s.Name.Name, s.Type)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						c.declared[n.Name] = true
					}
				}
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Ident:
			c.words[n.Name] = true
		case *ast.BasicLit:
			if n.Kind == token.STRING {
				c.addWords(n.Value)
			}
		case *ast.Field:
			// fields of anonymous structs and parameters
			for _, name := range n.Names {
				c.words[name.Name] = true
			}
		}
		return true
	})
}

// addMembers records the fields of a struct type and the methods of an
// interface type.
func (c codeNames) addMembers(typ string, expr ast.Expr) {
	var fields *ast.FieldList
	switch e := expr.(type) {
	case *ast.StructType:
		fields = e.Fields
	case *ast.InterfaceType:
		fields = e.Methods
	default:
		return
	}
	for _, f := range fields.List {
		for _, n := range f.Names {
			c.member(typ, n.Name)
		}
		if len(f.Names) == 0 { // an embedded type is a field by its name
			c.member(typ, receiverType(f.Type))
		}
	}
}

// receiverType is the name of the type of a receiver or embedded field:
// T, *T, T[P], pkg.T.
func receiverType(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiverType(e.X)
	case *ast.IndexExpr:
		return receiverType(e.X)
	case *ast.IndexListExpr:
		return receiverType(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.Ident:
		return e.Name
	}
	return ""
}

var (
	spanRE  = regexp.MustCompile("`([^`\n]+)`")
	fenceRE = regexp.MustCompile("(?ms)^```.*?^```")
	// identRE is a name or a chain of them, maybe a method expression's
	// (*T) and a call's empty parentheses.
	identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.(\(\*[A-Za-z_][A-Za-z0-9_]*\)|[A-Za-z_][A-Za-z0-9_]*))*(\(\))?$`)
	fileRE  = regexp.MustCompile(`\.(go|lua|json|sh|md|txt)$`)
	capsRE  = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	lowerRE = regexp.MustCompile(`^[a-z][a-z0-9]*(\(\))?$`)
)

// designSpans are the backticked spans of a Markdown text outside fenced
// blocks that have the shape of a Go name.
func designSpans(text string) []string {
	text = fenceRE.ReplaceAllString(text, "")
	var out []string
	for _, m := range spanRE.FindAllStringSubmatch(text, -1) {
		s := m[1]
		if identRE.MatchString(s) && !fileRE.MatchString(s) && !capsRE.MatchString(s) {
			out = append(out, s)
		}
	}
	return out
}

// missing says why span names nothing in the code, or "" if it does.
func (c codeNames) missing(span string) string {
	span = strings.TrimSuffix(span, "()")
	if !strings.Contains(span, ".") {
		switch {
		case c.declared[span]:
			return ""
		case strings.Contains(span, "_") && strings.ToLower(span) == span:
			return "" // an operator word such as local_quota
		case lowerRE.MatchString(span) && c.words[span]:
			return ""
		}
		return "no such name is declared"
	}
	parts := strings.Split(strings.NewReplacer("(*", "", ")", "").Replace(span), ".")
	if c.imports[parts[0]] && !c.packages[parts[0]] || strings.Contains(span, "_") {
		return "" // another package's name (time.Now) or a module ID (http.handlers.rate_limit)
	}
	if c.packages[parts[0]] && !c.declared[parts[0]] {
		parts = parts[1:] // limiter.X: X must be declared
		if !c.declared[parts[0]] {
			return "no such name is declared"
		}
	}
	for i := 1; i < len(parts); i++ {
		prev, name := parts[i-1], parts[i]
		if ms, isType := c.members[prev]; isType {
			if !ms[name] {
				return prev + " has no field or method " + name
			}
		} else if !c.declared[name] {
			return "no field or method " + name + " is declared"
		}
	}
	return ""
}

// TestDesignLayoutComplete keeps the layout tree of docs/design.md whole:
// every source file of the root package, of limiter and the packages
// beside it, and of lua is listed under its own directory, and every file
// the tree names exists.
func TestDesignLayoutComplete(t *testing.T) {
	text, err := os.ReadFile("docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(text), "## Package layout")
	tree := fenceRE.FindString(after)
	if tree == "" {
		t.Fatal(`docs/design.md has no tree under "## Package layout"`)
	}
	entries := layoutEntries(tree)
	for _, dir := range []string{".", "limiter", "limiter/redisstore", "limiter/nearcache", "limiter/internal/storetest", "lua"} {
		files, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range files {
			name := e.Name()
			if e.IsDir() || strings.HasSuffix(name, "_test.go") || (filepath.Ext(name) != ".go" && filepath.Ext(name) != ".lua") {
				continue
			}
			if path := filepath.ToSlash(filepath.Join(dir, name)); !entries[path] {
				t.Errorf("%s is missing from the layout in docs/design.md", path)
			}
		}
	}
	for path := range entries {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("docs/design.md's layout lists %s, which no longer exists", path)
		}
	}
	// Files a description names (internal/testutil's clock.go) must exist
	// somewhere.
	for _, f := range regexp.MustCompile(`[A-Za-z0-9_]+\.(go|lua)\b`).FindAllString(tree, -1) {
		if strings.HasPrefix(f, "_") { // *_test.go
			continue
		}
		found := false
		for _, pattern := range []string{"", "*/", "*/*/", "*/*/*/"} {
			m, _ := filepath.Glob(pattern + f)
			found = found || len(m) > 0
		}
		if !found {
			t.Errorf("docs/design.md's layout names %s, which no longer exists", f)
		}
	}
}

// layoutEntries reads a layout tree: the path of every .go and .lua file
// an entry names (an entry's first words, "a.lua, b.lua" naming two, on
// its own line or continuing the entries above it at their depth), from
// the directories it is drawn under, four columns a level.
func layoutEntries(tree string) map[string]bool {
	entryRE := regexp.MustCompile(`^[A-Za-z0-9_./*-]+(, [A-Za-z0-9_./*-]+)*`)
	paths := map[string]bool{}
	var dirs []string // dirs[d] is the directory entries at depth d+1 are in
	last := -1        // the column of the last entry's name
	for line := range strings.SplitSeq(tree, "\n") {
		runes := []rune(line)
		col := 0
		for col < len(runes) && strings.ContainsRune("│├└─ ", runes[col]) {
			col++
		}
		rest := string(runes[col:])
		branch := strings.ContainsAny(line, "├└")
		if rest == "" || !branch && col != last {
			continue // a description's continuation
		}
		last = col
		depth := col / 4
		names := entryRE.FindString(rest)
		if names == "" {
			continue
		}
		for name := range strings.SplitSeq(names, ", ") {
			if depth == 0 {
				continue // the root, "."
			}
			dirs = dirs[:min(len(dirs), depth-1)]
			parent := strings.Join(dirs, "")
			if strings.HasSuffix(name, "/") {
				dirs = append(dirs, name)
				continue
			}
			if ext := filepath.Ext(name); (ext == ".go" || ext == ".lua") && !strings.HasPrefix(name, "*") {
				paths[parent+name] = true
			}
		}
	}
	return paths
}

// TestDocsShowExamples: every example Caddyfile under examples/, which
// the end-to-end tests run as written, and Caddyfile.example, which the
// README's first command runs, appears whole in a caddyfile code block of
// README.md or a page under docs/, so what the docs show is what was
// tested.
func TestDocsShowExamples(t *testing.T) {
	pages := readDocs(t)
	files, err := filepath.Glob("examples/*.Caddyfile")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples/*.Caddyfile (%v)", err)
	}
	for _, f := range append(files, "Caddyfile.example") {
		example, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		shown := false
		for _, p := range pages {
			for _, b := range p.Blocks() {
				shown = shown || b.Info == "caddyfile" && b.Text == string(example)
			}
		}
		if !shown {
			t.Errorf("no page shows %s whole in a caddyfile code block", f)
		}
	}
}

// docBlockKinds are the info strings a fenced block of the docs may
// carry. A config is a "caddyfile" block, which e2e's
// TestDocsConfigsAdapt adapts (docs/testing.md has its rules); "caddyfile
// syntax" is a syntax summary, with <values> to fill in; "json" is a
// handler's JSON or a log line; "go" is code in the design; "promql" and
// "yaml" (a Prometheus rule file) are the queries and alerts of
// docs/coming-from-mholt.md, which e2e's TestComingFromMholt evaluates in
// a real Prometheus; the rest are commands, output and text.
var docBlockKinds = map[string]bool{"caddyfile": true, "caddyfile syntax": true, "json": true, "go": true, "promql": true, "yaml": true, "sh": true, "text": true, "": true}

// TestDocsBlockKinds: every fenced block of the docs is of a kind the
// tests know, so no config escapes the test that adapts them under an
// info string it does not read ("Caddyfile", "caddy").
func TestDocsBlockKinds(t *testing.T) {
	for _, p := range readDocs(t) {
		for _, b := range p.Blocks() {
			if !docBlockKinds[b.Info] {
				t.Errorf("%s:%d: a block of kind %q; the docs' tests know %v", p.Path, b.Line, b.Info, slices.Sorted(maps.Keys(docBlockKinds)))
			}
		}
	}
}

// TestDocsLinksResolve: every relative link of README.md and the pages
// under docs/ names a file that exists, and every #anchor (within the page
// or on another page of the docs) a heading that page has, as GitHub
// renders it. Links to other sites are not followed.
func TestDocsLinksResolve(t *testing.T) {
	pages := readDocs(t)
	anchors := map[string]map[string]bool{}
	for _, p := range pages {
		anchors[p.Path] = p.Anchors()
	}
	for _, p := range pages {
		for _, l := range p.Links() {
			if strings.Contains(l.Target, "://") || strings.HasPrefix(l.Target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(l.Target, "#")
			target := p.Path
			if file != "" {
				target = path.Clean(path.Join(path.Dir(p.Path), file))
				if _, err := os.Stat(filepath.FromSlash(target)); err != nil {
					t.Errorf("%s:%d: link to %s: %s does not exist", p.Path, l.Line, l.Target, target)
					continue
				}
			}
			if frag == "" {
				continue
			}
			have, ok := anchors[target]
			if !ok {
				if path.Ext(target) != ".md" {
					t.Errorf("%s:%d: link to %s: an anchor in a file that is not Markdown", p.Path, l.Line, l.Target)
					continue
				}
				text, err := os.ReadFile(filepath.FromSlash(target))
				if err != nil {
					t.Fatal(err)
				}
				have = docpages.Page{Path: target, Text: string(text)}.Anchors()
			}
			if !have[frag] {
				t.Errorf("%s:%d: link to %s: %s has no heading whose anchor is #%s", p.Path, l.Line, l.Target, target, frag)
			}
		}
	}
}

// readDocs reads README.md and the pages under docs/.
func readDocs(t *testing.T) []docpages.Page {
	t.Helper()
	pages, err := docpages.Read(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 2 {
		t.Fatalf("the docs are %d pages; want README.md and docs/*.md", len(pages))
	}
	return pages
}

// TestRootGivesBackOnlyThroughAdmissions: the root package never calls a
// store's give-back or charge itself; units come back only through the
// limiter.Admission that holds them (docs/design.md, "One record per zone,
// one phase").
func TestRootGivesBackOnlyThroughAdmissions(t *testing.T) {
	calls := regexp.MustCompile(`\.(store|local|Store)\.(GiveBack|Refund|Charge|Renew|ReturnMany|RefundMany)\(|limiter\.(Charger|Leaser)\)`)
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			if calls.MatchString(line) {
				t.Errorf("%s:%d calls a store's give-back or charge directly: %s", name, i+1, strings.TrimSpace(line))
			}
		}
	}
}
