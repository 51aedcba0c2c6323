package schedule

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MissedMode says what happens to firings whose time passed while no
// process had them enqueued.
type MissedMode uint8

// Missed modes. The zero value is MissedOnce, the default.
const (
	MissedOnce MissedMode = iota // run once for all of them, as the latest missed firing
	MissedSkip                   // run none of them
	MissedAll                    // run each of them, up to a cap: the latest ones
)

// DefaultMissedCap is how many missed firings MissedAll runs when its cap
// is not given; MaxMissedCap is the largest cap allowed.
const (
	DefaultMissedCap = 100
	MaxMissedCap     = 1000
)

// ErrInvalidMissed is wrapped by the errors of [ParseMissed] and
// [Missed.Validate].
var ErrInvalidMissed = errors.New("invalid missed policy")

// Missed is the policy for firings missed while no process was running.
// The zero value is "once".
type Missed struct {
	Mode MissedMode
	// Cap bounds how many missed firings MissedAll runs (0: the default);
	// it must be 0 for the other modes.
	Cap int
}

// ParseMissed reads a policy as written in a configuration: "skip", "once"
// (or empty, the default), "all" (with DefaultMissedCap) or "all:N".
func ParseMissed(s string) (Missed, error) {
	switch v := strings.TrimSpace(s); {
	case v == "" || v == "once":
		return Missed{Mode: MissedOnce}, nil
	case v == "skip":
		return Missed{Mode: MissedSkip}, nil
	case v == "all":
		return Missed{Mode: MissedAll}, nil
	case strings.HasPrefix(v, "all:"):
		n, err := strconv.Atoi(v[len("all:"):])
		if err != nil {
			return Missed{}, fmt.Errorf("%w: %q: the cap after \"all:\" must be a number", ErrInvalidMissed, s)
		}
		m := Missed{Mode: MissedAll, Cap: n}
		if n < 1 {
			return Missed{}, fmt.Errorf("%w: %q: the cap must be at least 1 (use \"skip\" to run none)", ErrInvalidMissed, s)
		}
		if err := m.Validate(); err != nil {
			return Missed{}, err
		}
		return m, nil
	default:
		return Missed{}, fmt.Errorf("%w: %q: want skip, once, all or all:N", ErrInvalidMissed, s)
	}
}

// Validate checks the mode and the cap.
func (m Missed) Validate() error {
	switch {
	case m.Mode > MissedAll:
		return fmt.Errorf("%w: unknown mode %d", ErrInvalidMissed, m.Mode)
	case m.Mode != MissedAll && m.Cap != 0:
		return fmt.Errorf("%w: a cap (%d) applies to \"all\" only", ErrInvalidMissed, m.Cap)
	case m.Cap < 0 || m.Cap > MaxMissedCap:
		return fmt.Errorf("%w: cap %d: want 1 to %d", ErrInvalidMissed, m.Cap, MaxMissedCap)
	}
	return nil
}

// String is the form ParseMissed reads.
func (m Missed) String() string {
	switch m.Mode {
	case MissedOnce:
		return "once"
	case MissedSkip:
		return "skip"
	case MissedAll:
		if m.Cap == 0 {
			return "all"
		}
		return "all:" + strconv.Itoa(m.Cap)
	}
	return fmt.Sprintf("missed(%d)", m.Mode)
}

// keep is how many of the latest missed firings the policy runs.
func (m Missed) keep() int {
	switch m.Mode {
	case MissedSkip:
		return 0
	case MissedAll:
		if m.Cap <= 0 {
			return DefaultMissedCap
		}
		return min(m.Cap, MaxMissedCap)
	}
	return 1
}

// countLimit bounds the work spent counting skipped firings.
const countLimit = 10000

// Plan is what one scheduling pass of an entry enqueues.
type Plan struct {
	// Missed are the missed firings the policy runs, oldest first: their
	// time has passed, so they are due at once.
	Missed []time.Time
	// Skipped counts the missed firings the policy left out; when
	// SkippedAtLeast is set there were more than this many, not counted.
	Skipped        int
	SkippedAtLeast bool
	// Upcoming are the firings after now, up to now + horizon, oldest
	// first: enqueue each due at its time.
	Upcoming []time.Time
	// Last is the new "last scheduled" firing to store with the entry, in
	// the same transaction as the enqueues and guarded by a watch on the
	// stored value: the latest firing this plan enqueued or chose to
	// skip. Unchanged when the plan is empty.
	Last time.Time
}

// Plan decides one scheduling pass of an entry. last is the last scheduled
// firing stored with the entry (the zero time for an entry never
// scheduled: it starts from now, nothing counts as missed); now is the
// caller's clock. The firings in (last, now] were missed, since a running
// process keeps its next firings enqueued ahead of time, and m decides
// which of them run. The firings in (max(last, now), now+horizon] are
// upcoming, at most limit of them; the rest come in a later pass, which
// continues from Last. The result depends only on the arguments, so
// processes that read the same last compute the same plan, and the same
// task ids ([FiringID]) for the same firings.
func (s *Schedule) Plan(m Missed, last, now time.Time, horizon time.Duration, limit int) Plan {
	p := Plan{Last: last}
	if !last.IsZero() && last.Before(now) {
		keep := m.keep()
		latest := s.Latest(last, now, max(keep, 1))
		if n := len(latest); n > 0 {
			p.Last = latest[n-1]
			kept := latest[max(0, n-keep):]
			if len(kept) > 0 {
				p.Missed = kept
			}
			// Skipped: the missed firings before the first one kept.
			upto := now
			if len(kept) > 0 {
				upto = kept[0].Add(-time.Nanosecond)
			}
			p.Skipped, p.SkippedAtLeast = s.count(last, upto, countLimit)
		}
	}
	from := now
	if last.After(from) {
		from = last
	}
	p.Upcoming = s.Between(from, now.Add(horizon), limit)
	if n := len(p.Upcoming); n > 0 {
		p.Last = p.Upcoming[n-1]
	}
	return p
}

// Latest returns the latest n firings in (after, upto], oldest first (the
// last firing before now, say, for a listing). A window ending at upto
// doubles until it holds n firings or reaches after, so the work is
// proportional to the firings near upto, not to the length of the range.
func (s *Schedule) Latest(after, upto time.Time, n int) []time.Time {
	if n < 1 {
		return nil
	}
	if s.every > 0 {
		hi := floorDiv(upto.Unix(), s.every)
		lo := floorDiv(after.Unix(), s.every) + 1 // the first multiple after after
		if hi < lo {
			return nil
		}
		if hi-lo+1 > int64(n) {
			lo = hi - int64(n) + 1
		}
		out := make([]time.Time, 0, hi-lo+1)
		for k := lo; k <= hi; k++ {
			out = append(out, time.Unix(k*s.every, 0).In(s.loc))
		}
		return out
	}
	for w := time.Minute; ; w *= 2 {
		lo := upto.Add(-w)
		final := !lo.After(after) || w > 1<<60
		if final {
			lo = after
		}
		got := s.tail(lo, upto, n)
		if len(got) == n || final {
			return got
		}
	}
}

// tail returns the latest n firings in (from, to], oldest first, keeping
// only n of them while walking.
func (s *Schedule) tail(from, to time.Time, n int) []time.Time {
	ring := make([]time.Time, 0, n)
	next := 0
	for t := from; ; {
		f := s.Next(t)
		if f.IsZero() || f.After(to) {
			break
		}
		if len(ring) < n {
			ring = append(ring, f)
		} else {
			ring[next] = f
			next = (next + 1) % n
		}
		t = f
	}
	return append(ring[next:len(ring):len(ring)], ring[:next]...)
}

// count returns how many firings lie in (after, upto]. A cron schedule
// counts at most limit of them, and then says so.
func (s *Schedule) count(after, upto time.Time, limit int) (int, bool) {
	if !upto.After(after) {
		return 0, false
	}
	if s.every > 0 {
		// Arithmetic, so exact whatever the limit.
		return int(floorDiv(upto.Unix(), s.every) - floorDiv(after.Unix(), s.every)), false
	}
	n := 0
	for t := after; ; {
		f := s.Next(t)
		if f.IsZero() || f.After(upto) {
			return n, false
		}
		if n == limit {
			return n, true
		}
		n++
		t = f
	}
}
