module github.com/floodgatehq/caddy-ratelimit/tools

go 1.26

tool github.com/caddyserver/xcaddy/cmd/xcaddy

require (
	github.com/Masterminds/semver/v3 v3.5.0 // indirect
	github.com/akavel/rsrc v0.10.2 // indirect
	github.com/caddyserver/xcaddy v0.4.7 // indirect
	github.com/google/shlex v0.0.0-20191202100458-e7afc7fbc510 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/josephspurrier/goversioninfo v1.7.0 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
)
