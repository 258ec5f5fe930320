package redistest

import (
	"context"
	"os"
	"strings"
	"testing"
)

// ACLRule is the ACL rule the file at path (docs/redis.md) gives for user:
// the words after "ACL SETUSER <user>" on the first line that begins so,
// each ">password" replaced with ">"+password. Tests create the user from
// it, so the documented rule and the tested one cannot drift apart.
func ACLRule(t testing.TB, path, user, password string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	head := "ACL SETUSER " + user + " "
	for line := range strings.SplitSeq(string(raw), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), head)
		if !ok {
			continue
		}
		rule := strings.Fields(rest)
		for i, w := range rule {
			if strings.HasPrefix(w, ">") {
				rule[i] = ">" + password
			}
		}
		return rule
	}
	t.Fatalf("redistest: %s has no line beginning %q", path, head)
	return nil
}

// SetUser creates user on s, or replaces its rules, with ACL SETUSER and
// rule.
func (s *Server) SetUser(t testing.TB, user string, rule []string) {
	t.Helper()
	args := []any{"ACL", "SETUSER", user}
	for _, w := range rule {
		args = append(args, w)
	}
	if err := s.Client(t).Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s %s on %s: %v", user, strings.Join(rule, " "), s.Addr(), err)
	}
}

// ACLDenials are the entries of ACL LOG on s: what a user was refused,
// each as "<user> <object>" (a command, or a key).
func (s *Server) ACLDenials(t testing.TB) []string {
	t.Helper()
	entries, err := s.Client(t).ACLLog(context.Background(), 100).Result()
	if err != nil {
		t.Fatalf("ACL LOG on %s: %v", s.Addr(), err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Username+" "+e.Object)
	}
	return out
}
