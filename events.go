package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
)

// exceededEvent is the event a refusal emits, named and shaped as
// mholt/caddy-ratelimit's, so configs that react to it keep working.
const exceededEvent = "rate_limit_exceeded"

// eventEmitter emits exceededEvent through Caddy's events app.
type eventEmitter struct {
	app *caddyevents.App
	ctx caddy.Context
}

// newEventEmitter finds the config's events app. A config without one has
// nothing subscribed, so it gets no emitter (nil emits nothing).
func newEventEmitter(ctx caddy.Context) (*eventEmitter, error) {
	app, err := ctx.AppIfConfigured("events")
	if errors.Is(err, caddy.ErrNotConfigured) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	events, ok := app.(*caddyevents.App)
	if !ok {
		return nil, fmt.Errorf("the events app is a %T", app)
	}
	return &eventEmitter{app: events, ctx: ctx}, nil
}

// exceeded emits a refusal by zone, with how long the client should wait
// and its IP. When nothing can observe the event (no subscriber, no debug
// log) it costs one lookup: a refusal under a flood must stay cheap.
func (e *eventEmitter) exceeded(r *http.Request, z *zone, wait time.Duration) {
	if e == nil || !e.app.ShouldEmit(exceededEvent) {
		return
	}
	e.app.Emit(e.ctx, exceededEvent, map[string]any{
		"zone":      z.name,
		"wait":      wait,
		"remote_ip": z.key.clientIP(r),
	})
}
