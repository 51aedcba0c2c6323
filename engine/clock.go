package engine

import (
	"time"

	"github.com/jonboulle/clockwork"
)

// Clock tells the time and sets timers. The engine reads due times, leases
// and periodic firings only through it, so a test can drive them with
// clockwork.NewFakeClock (advance an hour; see a delayed task run) and
// fault injection can run a process offset. Redis 2.4 has no TIME command:
// every due time and lease is on the clock of the process that computes
// it. What Redis times itself (key TTLs such as the heartbeat's, BLPOP
// timeouts) runs on real time, and so do the engine's waits that answer
// to it. It is clockwork's interface, a well-kept one with a fake that
// counts its sleepers.
type Clock = clockwork.Clock

func ms(t time.Time) int64 { return t.UnixMilli() }

// msCeil is t in Unix milliseconds rounded up: a due time stored in whole
// milliseconds must never be earlier than the time asked for.
func msCeil(t time.Time) int64 {
	m := t.UnixMilli()
	if time.UnixMilli(m).Before(t) {
		m++
	}
	return m
}

func fromMs(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v)
}
