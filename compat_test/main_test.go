// Package compat_test is the end-to-end conformance suite of the engine,
// written against its public API: one list of scenarios run on miniredis
// (with the Redis 2.4 hook) and on a redis-server restricted to the 2.4
// command table, or only on the server named by ENGINE_TEST_REDIS; a census
// of every command sent, checked against the 2.4 table and against
// docs/compat.md; and, for each Redis 2.4 behaviour that later versions
// changed and the engine touches, a test under both behaviours. See
// docs/compat.md.
package compat_test

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

// defaultParallel is how many scenarios run at once unless -test.parallel
// says otherwise: they mostly wait on timers and the network, and running
// eight at a time keeps the suite well under a minute on two cores.
const defaultParallel = "8"

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", defaultParallel)
	}
	// Fails the run if any goroutine outlives the tests (a blocking pop
	// left behind would sit in internal/poll.runtime_pollWait).
	goleak.VerifyTestMain(m)
}
