package schedule

import (
	"testing"
	"time"
)

// FuzzParse: no input makes Parse, Next, Between, Plan or Fingerprint
// panic, and what parses keeps its promises: Next is strictly later,
// Between is ordered and inside its range.
func FuzzParse(f *testing.F) {
	for _, seed := range []struct {
		cron, loc string
		every     int64
	}{
		{"* * * * *", "", 0}, {"*/15 2 * * *", "Europe/Berlin", 0}, {"0 30 1-3 * * *", "America/New_York", 0},
		{"@every 90s", "", 0}, {"@hourly", "Australia/Lord_Howe", 0}, {"TZ=", "", 0}, {"CRON_TZ=Europe/Berlin", "", 0},
		{"TZ=x", "", 0}, {"0 0 30 2 *", "", 0}, {"1-2/0 * * * *", "", 0}, {"--- * * * *", "", 0},
		{"", "", 60e9}, {"", "", 1}, {"@every -1s", "", 0}, {"? ? ? ? ?", "", 0}, {"0 0 * * 7", "", 0},
		{"0 0 29 2 mon", "America/Santiago", 0}, {"", "Europe/Berlin", 3600e9},
	} {
		f.Add(seed.cron, seed.loc, seed.every)
	}
	base := time.Date(2026, 3, 29, 0, 30, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, cron, loc string, every int64) {
		s, err := Parse(Spec{Cron: cron, Location: loc, Every: time.Duration(every)})
		if err != nil {
			return
		}
		_ = s.Fingerprint()
		_ = s.String()
		prev := base
		for _, f := range s.Between(base, base.AddDate(1, 0, 0), 5) {
			if !f.After(prev) {
				t.Fatalf("%v: firing %v not after %v", s, f, prev)
			}
			prev = f
		}
		if n := s.Next(base); !n.IsZero() && !n.After(base) {
			t.Fatalf("%v: Next(%v) = %v", s, base, n)
		}
		s.Plan(Missed{Mode: MissedAll, Cap: 3}, base.Add(-time.Hour), base, time.Minute, 3)
	})
}

// FuzzFiringID: every name and instant gives a valid task id.
func FuzzFiringID(f *testing.F) {
	f.Add("nightly report", int64(1774746000), int64(0))
	f.Add("", int64(-1), int64(5))
	f.Add("x@y~z", int64(1<<40), int64(999999999))
	f.Fuzz(func(t *testing.T, name string, sec, nsec int64) {
		id := FiringID(name, time.Unix(sec, nsec))
		if !validTaskID(id) {
			t.Fatalf("FiringID(%q, %d.%d) = %q: not a valid task id", name, sec, nsec, id)
		}
	})
}
