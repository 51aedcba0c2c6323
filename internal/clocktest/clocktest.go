// Package clocktest has clocks for tests of the engine's time handling:
// processes whose clocks disagree, or a test that needs to be hours away.
package clocktest

import "time"

// Offset is a clock a fixed offset away from the real one, for tests of
// clock skew between processes. It satisfies engine.Clock.
type Offset time.Duration

// Now returns the real time plus the offset.
func (o Offset) Now() time.Time { return time.Now().Add(time.Duration(o)) }
