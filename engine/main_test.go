package engine

import (
	"flag"
	"runtime"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's run if any goroutine outlives its tests (a
// blocking pop left behind would sit in internal/poll.runtime_pollWait).
//
// Unless -test.parallel is given, it runs more parallel tests than there
// are CPUs: the tests spend most of their time waiting on Redis servers of
// their own, not computing, so the default (GOMAXPROCS) leaves the
// machine idle.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(max(6, 3*runtime.GOMAXPROCS(0)))); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m)
}
