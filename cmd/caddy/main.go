// Command caddy builds Caddy with its standard modules and Floodgate, for
// operators and CI runs that do not use xcaddy.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/floodgatehq/caddy-ratelimit"
)

func main() {
	caddycmd.Main()
}
