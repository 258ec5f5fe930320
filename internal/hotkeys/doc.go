// Package hotkeys finds the keys one instance saw most in the last minute,
// per rate-limit zone, for the admin route that answers "who is hitting this
// zone?" without keeping a counter for every client.
//
// A Counter is a sharded space-saving summary (Metwally, Agrawal and El
// Abbadi, "Efficient computation of frequent and top-k elements in data
// streams", 2005): a fixed number of counters, set at construction, so its
// memory is the same for a thousand distinct keys as for a million. A key
// without a counter takes over the one with the smallest count and inherits
// that count plus one, remembering what it inherited as its error. Counts
// are therefore estimates: exact while a generation sees no more distinct
// keys than the capacity, and otherwise too high by at most the number of
// updates in the window divided by the capacity (Entry.Error says by how
// much for each key).
//
// The window is two half-minute generations: a Counter answers for the
// current one and the one before, so from 30 to 60 seconds back. Add never
// reads the clock (reading it can cost more than the whole update); Rotate
// and Top do, and Add follows the generation they publish.
package hotkeys
