package engine

import "time"

// Clock tells the time. The engine reads time only through a Clock, so
// tests and fault injection can run a process fast, slow or offset.
// Redis 2.4 has no TIME command: every due time and lease is on the clock
// of the process that computes it.
type Clock interface {
	Now() time.Time
}

// systemClock is the real clock, what a nil Config.Advanced.Clock means.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

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
