package ratelimit

import (
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// minKeySecret is the shortest key_secret taken: 128 bits, so the secret
// cannot be found by trying candidates either.
const minKeySecret = 16

// keyHasher is the hasher of the handler's key_secret, resolved, or nil
// without one. An error never shows the secret.
func (h *Handler) keyHasher() (*limiter.KeyHasher, error) {
	if h.KeySecret == "" {
		return nil, nil
	}
	secret, err := caddy.NewReplacer().ReplaceOrErr(h.KeySecret, true, true)
	if err == nil && secret == "" {
		err = errors.New("resolves to nothing")
	}
	if err != nil {
		return nil, fmt.Errorf("key_secret %q is empty when resolved (an unset environment variable?): %w", redactLiterals(h.KeySecret), err)
	}
	if len(secret) < minKeySecret {
		return nil, fmt.Errorf("key_secret must be at least %d bytes, got %d", minKeySecret, len(secret))
	}
	return limiter.NewKeyHasher([]byte(secret)), nil
}
