// Package testutil holds the helpers every test package of this module
// shares, so there is one fake clock, one way to wait for a condition, one
// goroutine-leak check and one way to find a free port, each with one set
// of deadlines, instead of copies that drift apart.
package testutil
