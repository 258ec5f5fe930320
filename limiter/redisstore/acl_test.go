package redisstore

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// aclUser and aclPassword are the Redis user the ACL tests create.
const aclUser, aclPassword = "floodgate", "acl-test-password"

// documentedACL is the ACL rule docs/redis.md gives Floodgate's user.
func documentedACL(t *testing.T) []string {
	t.Helper()
	return redistest.ACLRule(t, "../../docs/redis.md", aclUser, aclPassword)
}

// aclClient is a client of addrs that logs in as the ACL test user.
func aclClient(t *testing.T, addrs []string) redis.UniversalClient {
	t.Helper()
	c, err := Config{Addresses: addrs, Username: aclUser, Password: aclPassword}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRedisACLUser: a user created with exactly the ACL rule of
// docs/redis.md can do everything the store does (every algorithm's take,
// peek, refund and reset; leases and their batched give-back; renewals;
// concurrency slot renewal; the warm start's script loads and its INFO
// probe), on a standalone server and on a Cluster, and the servers log no
// denial.
func TestRedisACLUser(t *testing.T) {
	rule := documentedACL(t)
	ctx := context.Background()
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, tc := range []struct {
		name    string
		servers []*redistest.Server
		addrs   []string
	}{
		{"standalone", []*redistest.Server{standalone}, []string{standalone.Addr()}},
		{"cluster", cluster.Masters, cluster.Addrs()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, s := range tc.servers {
				s.SetUser(t, aclUser, rule)
			}
			client := aclClient(t, tc.addrs)
			if err := exerciseRedisStore(ctx, client); err != nil {
				t.Fatalf("as the documented ACL user: %v", err)
			}
			if c, ok := client.(*redis.Client); ok {
				if err := c.Info(ctx, "cluster").Err(); err != nil {
					t.Errorf("the warm start's INFO probe: %v", err)
				}
			}
			for _, s := range tc.servers {
				if denied := s.ACLDenials(t); len(denied) > 0 {
					t.Errorf("%s logged ACL denials: %v", s.Addr(), denied)
				}
			}
		})
	}
}

// TestRedisACLUserMissingCommand: a user whose rule lacks one command the
// store needs fails with an error that names the command: Redis's NOPERM
// for a command the store sends, and for one a script calls, the command
// Floodgate reads from the script's line where Redis 7.0 names only the
// line (Valkey and later Redis name it themselves).
func TestRedisACLUserMissingCommand(t *testing.T) {
	rule := documentedACL(t)
	s := redistest.Start(t)
	ctx := context.Background()
	for _, tc := range []struct {
		drop string
		want []string // any one of them
	}{
		{"+evalsha", []string{"'evalsha' command"}},
		{"+script|load", []string{"'script|load' command"}},
		{"+pexpire", []string{"calls PEXPIRE: the ACL user needs +pexpire", "'pexpire' command"}},
		{"+zadd", []string{"calls ZADD: the ACL user needs +zadd", "'zadd' command"}},
		{"+hscan", []string{"'hscan' command"}},
		{"+hset", []string{"calls HSET: the ACL user needs +hset", "'hset' command"}},
		{"+subscribe", []string{"'subscribe' command"}},
		{"&floodgate:*", []string{"can't publish to the channel", "No permissions to access a channel", "no permissions to access one of the channels"}},
	} {
		t.Run(tc.drop, func(t *testing.T) {
			if !slices.Contains(rule, tc.drop) {
				t.Fatalf("the documented rule has no %s", tc.drop)
			}
			if err := s.Client(t).FlushAll(ctx).Err(); err != nil { // what an earlier case left half done
				t.Fatal(err)
			}
			s.SetUser(t, aclUser, slices.DeleteFunc(slices.Clone(rule), func(w string) bool { return w == tc.drop }))
			err := exerciseRedisStore(ctx, aclClient(t, []string{s.Addr()}))
			if err == nil {
				t.Fatalf("a user without %s did all the store does", tc.drop)
			}
			if !slices.ContainsFunc(tc.want, func(w string) bool { return strings.Contains(err.Error(), w) }) {
				t.Errorf("error %q names none of %q", err, tc.want)
			}
		})
	}
}
