package buckets

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's run if any goroutine outlives its tests (a
// blocking pop left behind would sit in internal/poll.runtime_pollWait).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
