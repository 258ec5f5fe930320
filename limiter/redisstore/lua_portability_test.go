package redisstore

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/floodgatehq/caddy-ratelimit/lua"
)

// luaShared is what the scripts may use: the names that Lua 5.1 (Redis,
// Valkey) and Lua 5.4 (Dragonfly and others) both have, and Redis's API.
// Anything else, such as table.getn, table.maxn, a bare unpack, setfenv,
// loadstring, math.pow or string.gfind, breaks on one of them.
var luaShared = map[string]bool{
	"KEYS": true, "ARGV": true,
	"assert": true, "error": true, "ipairs": true, "next": true, "pairs": true,
	"pcall": true, "rawequal": true, "rawget": true, "rawset": true, "select": true,
	"tonumber": true, "tostring": true, "type": true, "xpcall": true,
	"string.byte": true, "string.char": true, "string.find": true, "string.format": true,
	"string.gmatch": true, "string.gsub": true, "string.len": true, "string.lower": true,
	"string.match": true, "string.rep": true, "string.reverse": true, "string.sub": true,
	"string.upper": true,
	"table.concat": true, "table.insert": true, "table.remove": true, "table.sort": true,
	"math.abs": true, "math.acos": true, "math.asin": true, "math.atan": true, "math.ceil": true,
	"math.cos": true, "math.exp": true, "math.floor": true, "math.fmod": true, "math.huge": true,
	"math.log": true, "math.max": true, "math.min": true, "math.pi": true, "math.random": true,
	"math.sin": true, "math.sqrt": true, "math.tan": true,
	"redis.call": true, "redis.pcall": true, "redis.error_reply": true, "redis.status_reply": true,
	"redis.sha1hex": true, "redis.log": true,
}

// luaCompat are the only places a name of one version may appear: as the
// other's fallback, bound to a local once.
var luaCompat = []string{"table.unpack or unpack"}

// luaLibraries are the global tables whose members a script names.
var luaLibraries = map[string]bool{
	"string": true, "table": true, "math": true, "redis": true, "os": true, "io": true,
	"bit": true, "bit32": true, "utf8": true, "coroutine": true, "debug": true,
	"cjson": true, "cmsgpack": true, "struct": true,
}

// luaKeyless are the commands the scripts run that take no key: PUBLISH
// names a channel, which no server routes or checks as a key.
var luaKeyless = map[string]bool{"TIME": true, "PUBLISH": true}

var luaKeywords = map[string]bool{
	"and": true, "break": true, "do": true, "else": true, "elseif": true, "end": true,
	"false": true, "for": true, "function": true, "goto": true, "if": true, "in": true,
	"local": true, "nil": true, "not": true, "or": true, "repeat": true, "return": true,
	"then": true, "true": true, "until": true, "while": true,
}

// luaToken is a name, a string literal (kind 's', its contents), a number
// (kind '0') or a punctuation mark (kind 'p').
type luaToken struct {
	kind byte
	text string
}

// luaTokens splits a script into tokens, leaving out comments.
func luaTokens(src string) ([]luaToken, error) {
	var toks []luaToken
	longClose := func(i int) (string, int) { // at "[[" or "[=[": its closing bracket
		j := i + 1
		for j < len(src) && src[j] == '=' {
			j++
		}
		if j < len(src) && src[j] == '[' {
			return "]" + strings.Repeat("=", j-i-1) + "]", j + 1
		}
		return "", i
	}
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case strings.HasPrefix(src[i:], "--"):
			if close, body := longClose(i + 2); close != "" && src[i+2] == '[' {
				end := strings.Index(src[body:], close)
				if end < 0 {
					return nil, fmt.Errorf("unclosed long comment at %d", i)
				}
				i = body + end + len(close)
				continue
			}
			if nl := strings.IndexByte(src[i:], '\n'); nl >= 0 {
				i += nl
			} else {
				i = len(src)
			}
		case c == '\'' || c == '"':
			var b strings.Builder
			j := i + 1
			for ; j < len(src) && src[j] != c; j++ {
				if src[j] == '\\' {
					j++
				}
				if j < len(src) {
					b.WriteByte(src[j])
				}
			}
			if j >= len(src) {
				return nil, fmt.Errorf("unclosed string at %d", i)
			}
			toks = append(toks, luaToken{'s', b.String()})
			i = j + 1
		case c == '[' && i+1 < len(src) && (src[i+1] == '[' || src[i+1] == '='):
			close, body := longClose(i)
			if close == "" {
				toks = append(toks, luaToken{'p', "["})
				i++
				continue
			}
			end := strings.Index(src[body:], close)
			if end < 0 {
				return nil, fmt.Errorf("unclosed long string at %d", i)
			}
			toks = append(toks, luaToken{'s', src[body : body+end]})
			i = body + end + len(close)
		case c == '_' || unicode.IsLetter(rune(c)):
			j := i
			for j < len(src) && (src[j] == '_' || unicode.IsLetter(rune(src[j])) || unicode.IsDigit(rune(src[j]))) {
				j++
			}
			toks = append(toks, luaToken{'n', src[i:j]})
			i = j
		case unicode.IsDigit(rune(c)):
			j := i
			for j < len(src) && (unicode.IsDigit(rune(src[j])) || strings.IndexByte(".xXabcdefABCDEF", src[j]) >= 0) {
				j++
			}
			toks = append(toks, luaToken{'0', src[i:j]})
			i = j
		default:
			for _, op := range []string{"...", "..", "==", "~=", "<=", ">="} {
				if strings.HasPrefix(src[i:], op) {
					toks = append(toks, luaToken{'p', op})
					i += len(op)
					goto next
				}
			}
			toks = append(toks, luaToken{'p', string(c)})
			i++
		next:
		}
	}
	return toks, nil
}

// luaUse is what a script uses of its environment and how it names keys.
type luaUse struct {
	// names are the globals and library members it uses.
	names []string
	// keyArgs are, for each redis.call and redis.pcall, the command and
	// the expression of its first argument when that is not a key the
	// script received in KEYS.
	badKeys []string
}

// luaUses reads a whole script (as sent to Redis): the globals it uses,
// every name that is not a local, a parameter, a loop variable, a member
// or a table constructor's key; the members of the libraries; and the
// key arguments of its Redis calls.
func luaUses(src string) (luaUse, error) {
	for _, c := range luaCompat {
		src = strings.ReplaceAll(src, c, "nil")
	}
	toks, err := luaTokens(src)
	if err != nil {
		return luaUse{}, err
	}
	locals := map[string]bool{}
	// keyLocals are locals bound to KEYS[n]: `local key = KEYS[1]`.
	keyLocals := map[string]bool{}
	at := func(i int) luaToken {
		if i < 0 || i >= len(toks) {
			return luaToken{}
		}
		return toks[i]
	}
	is := func(i int, kind byte, text string) bool { t := at(i); return t.kind == kind && t.text == text }
	// Declarations, wherever they stand: scopes are not followed, so a
	// name declared local anywhere counts as local everywhere.
	for i := range toks {
		switch {
		case is(i, 'n', "local") && is(i+1, 'n', "function"):
			locals[at(i+2).text] = true
		case is(i, 'n', "local"):
			j := i + 1
			for ; at(j).kind == 'n'; j += 2 {
				locals[at(j).text] = true
				if !is(j+1, 'p', ",") {
					break
				}
			}
			if is(j+1, 'p', "=") && is(j+2, 'n', "KEYS") && is(j+3, 'p', "[") && (is(j+5, 'p', "]")) {
				keyLocals[at(j).text] = true
			}
		case is(i, 'n', "function"):
			j := i + 1
			for at(j).kind == 'n' || is(j, 'p', ".") || is(j, 'p', ":") {
				j++
			}
			for j++; at(j).kind == 'n' || is(j, 'p', ","); j++ {
				if at(j).kind == 'n' {
					locals[at(j).text] = true
				}
			}
		case is(i, 'n', "for"):
			for j := i + 1; (at(j).kind == 'n' && at(j).text != "in") || is(j, 'p', ","); j++ {
				if at(j).kind == 'n' {
					locals[at(j).text] = true
				}
			}
		}
	}
	var use luaUse
	seen := map[string]bool{}
	add := func(name string) {
		if !seen[name] {
			seen[name] = true
			use.names = append(use.names, name)
		}
	}
	depth := 0
	for i, t := range toks {
		switch {
		case t.kind == 'p' && t.text == "{":
			depth++
		case t.kind == 'p' && t.text == "}":
			depth--
		}
		if t.kind != 'n' || luaKeywords[t.text] || locals[t.text] {
			continue
		}
		if is(i-1, 'p', ".") || is(i-1, 'p', ":") {
			continue // a member, counted with its table below
		}
		if is(i+1, 'p', "=") && depth > 0 && (is(i-1, 'p', "{") || is(i-1, 'p', ",")) {
			continue // a table constructor's key
		}
		if luaLibraries[t.text] && is(i+1, 'p', ".") && at(i+2).kind == 'n' {
			add(t.text + "." + at(i+2).text)
			if t.text == "redis" && (at(i+2).text == "call" || at(i+2).text == "pcall") && is(i+3, 'p', "(") {
				cmd := at(i + 4)
				if cmd.kind != 's' {
					use.badKeys = append(use.badKeys, "a command that is not a literal")
					continue
				}
				if luaKeyless[strings.ToUpper(cmd.text)] {
					continue
				}
				arg := at(i + 6)
				switch {
				case !is(i+5, 'p', ","):
					use.badKeys = append(use.badKeys, cmd.text+" with no key")
				case arg.kind == 'n' && arg.text == "KEYS" && is(i+7, 'p', "[") && at(i+8).kind == '0' && is(i+9, 'p', "]") && (is(i+10, 'p', ",") || is(i+10, 'p', ")")):
				case arg.kind == 'n' && keyLocals[arg.text] && (is(i+7, 'p', ",") || is(i+7, 'p', ")")):
				default:
					use.badKeys = append(use.badKeys, cmd.text+" on "+arg.text+"…")
				}
			}
			continue
		}
		add(t.text)
	}
	slices.Sort(use.names)
	return use, nil
}

// TestLuaScriptsPortable reads every script the stores send, whole as Redis
// receives it (single and batch, calendar too), and fails on any global
// or library function outside what Lua 5.1 and Lua 5.4 share, and on any
// Redis call whose key is not one the script received in KEYS: servers
// such as Dragonfly run Lua 5.4 and refuse undeclared keys.
func TestLuaScriptsPortable(t *testing.T) {
	type source struct{ name, text string }
	sources := []source{{"time_probe", lua.TimeProbe()}, {"override_set", lua.OverrideSet()},
		{"pool_spend", lua.PoolSpend()}, {"pool_fill", lua.PoolFill()}}
	for _, alg := range algorithmTable {
		for _, s := range []struct {
			what string
			scripts
		}{{"", alg.scripts}, {" calendar", alg.calendarScripts}} {
			for _, src := range []struct{ kind, text string }{{"single", s.one}, {"batch", s.batch}} {
				if src.text != "" {
					sources = append(sources, source{fmt.Sprintf("%s%s %s", alg.name, s.what, src.kind), src.text})
				}
			}
		}
	}
	if len(sources) < 2+2*len(algorithmTable) {
		t.Fatalf("read %d scripts, want at least %d", len(sources), 2+2*len(algorithmTable))
	}
	for _, src := range sources {
		use, err := luaUses(src.text)
		if err != nil {
			t.Fatalf("%s: %v", src.name, err)
		}
		for _, g := range use.names {
			if !luaShared[g] {
				t.Errorf("%s uses %s, which Lua 5.1 and 5.4 do not both have", src.name, g)
			}
		}
		for _, k := range use.badKeys {
			t.Errorf("%s: redis.call %s: the key is not one the script received in KEYS", src.name, k)
		}
		if testing.Verbose() {
			t.Logf("%s uses %s", src.name, strings.Join(use.names, " "))
		}
	}
}

// TestLuaPortabilityCheckFails: the check above finds what it looks for, in
// scripts made to break it.
func TestLuaPortabilityCheckFails(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"local n = table.getn(ARGV)", "table.getn"},
		{"local n = table.maxn(ARGV)", "table.maxn"},
		{"redis.call('DEL', unpack(KEYS))", "unpack"},
		{"setfenv(1, {})", "setfenv"},
		{"local f = loadstring('return 1')", "loadstring"},
		{"local x = math.pow(2, 3)", "math.pow"},
		{"for w in string.gfind(ARGV[1], '%a+') do end", "string.gfind"},
		{"local x = {unpack = 1}; return x.unpack", ""},
		{"local unpack = table.unpack or unpack; return unpack(ARGV)", ""},
	} {
		use, err := luaUses(tc.src)
		if err != nil {
			t.Fatal(err)
		}
		var outside []string
		for _, g := range use.names {
			if !luaShared[g] {
				outside = append(outside, g)
			}
		}
		if got := strings.Join(outside, " "); got != tc.want {
			t.Errorf("%q: outside the shared set %q, want %q", tc.src, got, tc.want)
		}
	}
	for _, tc := range []struct {
		src  string
		good bool
	}{
		{"redis.call('GET', KEYS[1])", true},
		{"local key = KEYS[1]; redis.call('LLEN', key)", true},
		{"redis.call('TIME')", true},
		{"redis.call('GET', 'floodgate:' .. ARGV[1])", false},
		{"redis.call('GET', KEYS[1] .. ':old')", false},
		{"local k = ARGV[1]; redis.call('DEL', k)", false},
	} {
		use, err := luaUses(tc.src)
		if err != nil {
			t.Fatal(err)
		}
		if good := len(use.badKeys) == 0; good != tc.good {
			t.Errorf("%q: keys declared %v (%v), want %v", tc.src, good, use.badKeys, tc.good)
		}
	}
}
