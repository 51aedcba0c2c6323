package schedule

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// ErrInvalidSpec is wrapped by every error of [Parse].
var ErrInvalidSpec = errors.New("invalid schedule")

// Spec is the definition of a schedule as a user writes it: exactly one of
// Cron and Every.
type Spec struct {
	// Cron is a cron expression: 5 fields (minute hour day-of-month month
	// day-of-week) or 6 (a seconds field first), or a descriptor (@yearly,
	// @monthly, @weekly, @daily, @hourly, @every <duration>).
	Cron string
	// Location is the IANA time zone Cron is read in ("Europe/Berlin");
	// empty means UTC. It has no meaning for a fixed interval.
	Location string
	// Every is a fixed interval, whole seconds, at least one second.
	Every time.Duration
}

// Schedule is a parsed Spec. It is immutable and safe for concurrent use.
type Schedule struct {
	every     int64              // seconds; 0 for a cron schedule
	spec      *cron.SpecSchedule // matches wall-clock times, read as if UTC
	loc       *time.Location
	timeOfDay bool // the hour field does not name every hour: see the package doc
	canon     string
}

// parser reads 5 or 6 fields and descriptors.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// maxCronLen bounds what is handed to the cron parser.
const maxCronLen = 1024

// Parse checks spec and returns its schedule. Errors wrap ErrInvalidSpec
// and say what is wrong: a bad field, an unknown time zone, a schedule that
// never fires.
func Parse(spec Spec) (*Schedule, error) {
	expr := strings.TrimSpace(spec.Cron)
	switch {
	case expr == "" && spec.Every == 0:
		return nil, invalid("no schedule: give a cron expression or an interval (every)")
	case expr != "" && spec.Every != 0:
		return nil, invalid("cron %q and every %s both given: choose one", spec.Cron, spec.Every)
	case spec.Every != 0:
		if spec.Location != "" {
			return nil, invalid("every %s: a time zone (%q) has no meaning for a fixed interval", spec.Every, spec.Location)
		}
		return parseEvery(spec.Every, "every "+spec.Every.String())
	}
	if len(expr) > maxCronLen {
		return nil, invalid("cron expression is %d bytes long; at most %d", len(expr), maxCronLen)
	}
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, invalid("cron %q: give the time zone as the location, not inside the expression", spec.Cron)
	}
	if strings.HasPrefix(expr, "@every") {
		f := strings.Fields(expr)
		if len(f) != 2 || f[0] != "@every" {
			return nil, invalid("cron %q: want \"@every <duration>\", such as \"@every 90s\"", spec.Cron)
		}
		d, err := time.ParseDuration(f[1])
		if err != nil {
			return nil, invalid("cron %q: %v", spec.Cron, err)
		}
		if spec.Location != "" {
			return nil, invalid("cron %q: a time zone (%q) has no meaning for a fixed interval", spec.Cron, spec.Location)
		}
		return parseEvery(d, "cron "+expr)
	}
	loc, err := loadLocation(spec.Location)
	if err != nil {
		return nil, err
	}
	parsed, err := parser.Parse(expr)
	if err != nil {
		return nil, invalid("cron %q: %v", spec.Cron, err)
	}
	ss, ok := parsed.(*cron.SpecSchedule)
	if !ok { // only @every yields another type, handled above
		return nil, invalid("cron %q: unsupported form", spec.Cron)
	}
	naive := *ss
	naive.Location = time.UTC
	const allHours = 1<<24 - 1
	s := &Schedule{
		spec:      &naive,
		loc:       loc,
		timeOfDay: naive.Hour&allHours != allHours,
	}
	// The fields as bits say exactly when it fires: "@hourly", "0 * * * *"
	// and "0 0 * * * *" have the same canonical form.
	s.canon = fmt.Sprintf("cron/v1 %x %x %x %x %x %x %s", naive.Second, naive.Minute, naive.Hour, naive.Dom, naive.Month, naive.Dow, loc)
	// A day that does not exist ("0 0 30 2 *") would never fire: the
	// parser finds no match within its five-year search.
	if naive.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return nil, invalid("cron %q never fires (no such date)", spec.Cron)
	}
	return s, nil
}

func parseEvery(d time.Duration, what string) (*Schedule, error) {
	switch {
	case d < time.Second:
		return nil, invalid("%s: the interval must be at least 1s", what)
	case d%time.Second != 0:
		return nil, invalid("%s: the interval must be whole seconds", what)
	}
	secs := int64(d / time.Second)
	return &Schedule{every: secs, loc: time.UTC, canon: fmt.Sprintf("every/v1 %ds", secs)}, nil
}

func loadLocation(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	if name == "Local" {
		return nil, invalid("time zone %q: the host's zone differs between processes; name an IANA zone such as \"Europe/Berlin\", or leave it empty for UTC", name)
	}
	loc, err := time.LoadLocation(name)
	if err == nil {
		return loc, nil
	}
	if strings.HasPrefix(err.Error(), "unknown time zone") {
		// Either the name is wrong or the host has no zone database: say both.
		return nil, fmt.Errorf("%w: unknown time zone %q (not an IANA zone name, or no time zone database on this host: install tzdata or link time/tzdata)", ErrInvalidSpec, name)
	}
	return nil, fmt.Errorf("%w: time zone %q: %w", ErrInvalidSpec, name, err)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...))
}

// String describes the schedule in its canonical form.
func (s *Schedule) String() string { return s.canon }

// Fingerprint is a short digest of what the schedule fires on (the
// canonical form, not the text as written): two specs that fire at the
// same times have the same fingerprint, and a process that finds another
// fingerprint stored with an entry knows the schedule changed.
func (s *Schedule) Fingerprint() string {
	sum := sha256.Sum256([]byte(s.canon))
	return hex.EncodeToString(sum[:8])
}

// Location is the time zone the schedule is read in (UTC for an interval).
// Firings are returned in it.
func (s *Schedule) Location() *time.Location { return s.loc }

// Next returns the first firing strictly after after, or the zero time if
// the schedule never fires again (a cron date beyond the parser's
// five-year search).
func (s *Schedule) Next(after time.Time) time.Time {
	if s.every > 0 {
		k := floorDiv(after.Unix(), s.every) + 1
		return time.Unix(k*s.every, 0).In(s.loc)
	}
	return s.nextCron(after)
}

// Between returns the firings in (from, to], oldest first, at most max of
// them (none when max < 1).
func (s *Schedule) Between(from, to time.Time, max int) []time.Time {
	var out []time.Time
	for t := from; len(out) < max; {
		n := s.Next(t)
		if n.IsZero() || n.After(to) {
			break
		}
		out = append(out, n)
		t = n
	}
	return out
}

// maxPeriods bounds the zone periods (spans of one UTC offset) that one
// Next walks through; zones change offset at most a few times a year and
// the cron parser gives up after five years.
const maxPeriods = 64

// nextCron walks the zone periods from after on. Within one period the
// offset is fixed, so the wall-clock times of the period are one span of
// naive times (wall clock read as if UTC) and the cron parser finds the
// first match in it; a match beyond the span belongs to a later period.
// Time-of-day schedules also remember the latest wall time already passed
// (hw): a repeated hour does not fire again, and wall times skipped by a
// gap fire at the start of the period after the gap.
func (s *Schedule) nextCron(after time.Time) time.Time {
	t := after.In(s.loc)
	start, end := t.ZoneBounds()
	_, off := t.Zone()
	lo, inclusive := naive(after, off), false
	if s.timeOfDay && !start.IsZero() {
		_, prev := start.Add(-time.Nanosecond).In(s.loc).Zone()
		if hw := naive(start, prev); hw.After(lo) {
			lo, inclusive = hw, true // after is in a repeated hour
		}
	}
	for range maxPeriods {
		from := lo
		if inclusive {
			from = lo.Add(-time.Nanosecond)
		}
		w := s.spec.Next(from)
		if w.IsZero() {
			return time.Time{}
		}
		if end.IsZero() || w.Before(naive(end, off)) {
			if s.timeOfDay && !start.IsZero() && w.Before(naive(start, off)) {
				return start.In(s.loc) // a wall time in the gap before this period
			}
			return time.Unix(w.Unix()-int64(off), int64(w.Nanosecond())).In(s.loc)
		}
		hw := naive(end, off)
		start = end
		t = end.In(s.loc)
		_, off = t.Zone()
		_, end = t.ZoneBounds()
		if s.timeOfDay {
			lo = hw
		} else {
			lo = naive(start, off)
		}
		inclusive = true
	}
	return time.Time{}
}

// naive is the wall-clock time of instant t at offset off, as a UTC time.
func naive(t time.Time, off int) time.Time {
	return time.Unix(t.Unix()+int64(off), int64(t.Nanosecond())).UTC()
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
