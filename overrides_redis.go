package ratelimit

import (
	"github.com/caddyserver/caddy/v2"
)

// redisOverrides: placeholder until the Redis side lands (same session).
func (h *Handler) redisOverrides(ctx caddy.Context, zone string) (overrideSet, error) {
	return loadMemoryOverrides(ctx, zone, h.logger), nil
}
