// Package jwtauth turns the bearer token of an HTTP request into verified
// claims, so a rate limit can be keyed by who is calling rather than by the
// address they call from. It exists apart from the Caddy handler because
// verifying tokens is a job of its own, with its own dangers (algorithm
// confusion, forged key sets, a flood of bad tokens costing a signature
// check each) and its own state (key sets refreshed in the background, a
// cache of verified tokens); the handler only configures a Verifier and
// asks it for claims.
//
// A Verifier reads the token from one place of the request (Place), checks
// its signature against a shared secret, a PEM public key or a JSON Web Key
// Set fetched from a URL, then its exp, nbf, iss and aud claims. Outcomes,
// failures included, are cached by token, so a client repeating its token
// costs one signature check, not one per request. Time is read from the
// Options' Clock, so tests step it exactly.
package jwtauth
