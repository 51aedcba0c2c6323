package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseMissed(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Missed
	}{
		{"", Missed{Mode: MissedOnce}},
		{"once", Missed{Mode: MissedOnce}},
		{" skip ", Missed{Mode: MissedSkip}},
		{"all", Missed{Mode: MissedAll}},
		{"all:5", Missed{Mode: MissedAll, Cap: 5}},
		{"all:1000", Missed{Mode: MissedAll, Cap: 1000}},
	} {
		got, err := ParseMissed(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseMissed(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if err == nil {
			if again, err := ParseMissed(got.String()); err != nil || again != got {
				t.Errorf("ParseMissed(%q.String() = %q) = %+v, %v", tc.in, got.String(), again, err)
			}
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"sometimes", "want skip, once, all or all:N"},
		{"all:", "must be a number"},
		{"all:x", "must be a number"},
		{"all:0", "at least 1"},
		{"all:-3", "at least 1"},
		{"all:1001", "want 1 to 1000"},
		{"ONCE", "want skip, once"},
	} {
		_, err := ParseMissed(tc.in)
		if err == nil || !errors.Is(err, ErrInvalidMissed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseMissed(%q) error %v, want ErrInvalidMissed saying %q", tc.in, err, tc.want)
		}
	}
	for _, m := range []Missed{{Mode: MissedSkip, Cap: 3}, {Mode: 7}, {Mode: MissedAll, Cap: -1}} {
		if err := m.Validate(); !errors.Is(err, ErrInvalidMissed) {
			t.Errorf("%+v.Validate() = %v, want ErrInvalidMissed", m, err)
		}
	}
}

func TestPlan(t *testing.T) {
	every10 := Spec{Every: 10 * time.Second}
	cron10 := Spec{Cron: "*/10 * * * * *"} // the same firings, computed the cron way
	// now 12:00:35.5; last scheduled 12:00:00: 12:00:10, :20, :30 missed.
	now := utc("2026-05-01T12:00:35.5Z")
	last := utc("2026-05-01T12:00:00Z")
	ts := func(secs ...int) []time.Time {
		var out []time.Time
		for _, s := range secs {
			out = append(out, utc("2026-05-01T12:00:00Z").Add(time.Duration(s)*time.Second))
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		missed   Missed
		last     time.Time
		horizon  time.Duration
		limit    int
		want     []time.Time // Missed
		skipped  int
		upcoming []time.Time
		newLast  time.Time
	}{
		{"skip", Missed{Mode: MissedSkip}, last, 30 * time.Second, 10,
			nil, 3, ts(40, 50, 60), ts(60)[0]},
		{"once: the latest missed firing", Missed{}, last, 30 * time.Second, 10,
			ts(30), 2, ts(40, 50, 60), ts(60)[0]},
		{"all", Missed{Mode: MissedAll}, last, 30 * time.Second, 10,
			ts(10, 20, 30), 0, ts(40, 50, 60), ts(60)[0]},
		{"all, capped: the latest two", Missed{Mode: MissedAll, Cap: 2}, last, 30 * time.Second, 10,
			ts(20, 30), 1, ts(40, 50, 60), ts(60)[0]},
		{"new entry: nothing missed", Missed{Mode: MissedAll}, time.Time{}, 30 * time.Second, 10,
			nil, 0, ts(40, 50, 60), ts(60)[0]},
		{"last ahead of now: continue after it", Missed{}, ts(50)[0], 30 * time.Second, 10,
			nil, 0, ts(60), ts(60)[0]},
		{"last beyond the horizon: nothing", Missed{}, ts(90)[0], 30 * time.Second, 10,
			nil, 0, nil, ts(90)[0]},
		{"limit: Last is the last one enqueued", Missed{}, last, time.Minute, 2,
			ts(30), 2, ts(40, 50), ts(50)[0]},
		{"no horizon: Last covers the missed ones", Missed{Mode: MissedSkip}, last, 0, 10,
			nil, 3, nil, ts(30)[0]},
		{"last just before the next firing: none missed", Missed{}, ts(30)[0], 10 * time.Second, 10,
			nil, 0, ts(40), ts(40)[0]},
	} {
		for _, spec := range []Spec{every10, cron10} {
			t.Run(tc.name+"/"+mustParse(t, spec).String(), func(t *testing.T) {
				p := mustParse(t, spec).Plan(tc.missed, tc.last, now, tc.horizon, tc.limit)
				if !equalTimes(p.Missed, tc.want) {
					t.Errorf("Missed = %v, want %v", p.Missed, tc.want)
				}
				if p.Skipped != tc.skipped || p.SkippedAtLeast {
					t.Errorf("Skipped = %d (at least: %v), want %d", p.Skipped, p.SkippedAtLeast, tc.skipped)
				}
				if !equalTimes(p.Upcoming, tc.upcoming) {
					t.Errorf("Upcoming = %v, want %v", p.Upcoming, tc.upcoming)
				}
				if !p.Last.Equal(tc.newLast) {
					t.Errorf("Last = %v, want %v", p.Last, tc.newLast)
				}
			})
		}
	}
}

// TestPlanLongOutage: after a year down, each policy still plans in
// bounded work and counts what it left out.
func TestPlanLongOutage(t *testing.T) {
	last := utc("2025-05-01T00:00:00Z")
	now := utc("2026-05-01T00:00:00.5Z")
	year := int(now.Sub(last) / time.Second) // every-second firings in (last, now]
	for _, tc := range []struct {
		spec   Spec
		exact  bool // count is cheap (interval) and exact
		missed Missed
		keep   int
	}{
		{Spec{Every: time.Second}, true, Missed{Mode: MissedSkip}, 0},
		{Spec{Every: time.Second}, true, Missed{}, 1},
		{Spec{Every: time.Second}, true, Missed{Mode: MissedAll, Cap: 50}, 50},
		{Spec{Cron: "* * * * * *"}, false, Missed{Mode: MissedSkip}, 0},
		{Spec{Cron: "* * * * * *"}, false, Missed{}, 1},
		{Spec{Cron: "* * * * * *"}, false, Missed{Mode: MissedAll}, DefaultMissedCap},
	} {
		s := mustParse(t, tc.spec)
		p := s.Plan(tc.missed, last, now, 3*time.Second, 100)
		if len(p.Missed) != tc.keep {
			t.Errorf("%v %v: %d missed firings kept, want %d", s, tc.missed, len(p.Missed), tc.keep)
		}
		if tc.keep > 0 && !p.Missed[len(p.Missed)-1].Equal(utc("2026-05-01T00:00:00Z")) {
			t.Errorf("%v %v: latest kept %v, want the latest missed firing", s, tc.missed, p.Missed[len(p.Missed)-1])
		}
		if tc.exact && (p.Skipped != year-tc.keep || p.SkippedAtLeast) {
			t.Errorf("%v %v: skipped %d, want %d", s, tc.missed, p.Skipped, year-tc.keep)
		}
		if !tc.exact && (p.Skipped != countLimit || !p.SkippedAtLeast) {
			t.Errorf("%v %v: skipped %d (at least %v), want at least %d", s, tc.missed, p.Skipped, p.SkippedAtLeast, countLimit)
		}
		if len(p.Upcoming) != 3 || !p.Last.Equal(utc("2026-05-01T00:00:03Z")) {
			t.Errorf("%v %v: upcoming %v, last %v", s, tc.missed, p.Upcoming, p.Last)
		}
	}
}

// TestPlanContinues: passes run one after another from the stored Last
// enqueue every firing exactly once, and a pass after an outage applies
// the policy to the outage's firings only.
func TestPlanContinues(t *testing.T) {
	s := mustParse(t, Spec{Cron: "*/7 * * * * *"})
	start := utc("2026-05-01T00:00:00Z")
	var last time.Time
	seen := map[time.Time]int{}
	// Passes every 3 s with a 10 s horizon for two minutes.
	for now := start; now.Before(start.Add(2 * time.Minute)); now = now.Add(3 * time.Second) {
		p := s.Plan(Missed{}, last, now, 10*time.Second, 2)
		if len(p.Missed) != 0 {
			t.Fatalf("pass at %v: missed %v with the horizon covering the gap", now, p.Missed)
		}
		for _, f := range p.Upcoming {
			seen[f]++
		}
		last = p.Last
	}
	want := s.Between(start, last, 1000)
	if len(want) == 0 || len(seen) != len(want) {
		t.Fatalf("enqueued %d firings, want %d", len(seen), len(want))
	}
	for _, f := range want {
		if seen[f] != 1 {
			t.Errorf("firing %v enqueued %d times", f, seen[f])
		}
	}
	// A 40 s outage: the firings in (last, now] are missed, once runs the latest.
	now := last.Add(40 * time.Second)
	p := s.Plan(Missed{}, last, now, 10*time.Second, 100)
	lost := s.Between(last, now, 100)
	if len(p.Missed) != 1 || !p.Missed[0].Equal(lost[len(lost)-1]) || p.Skipped != len(lost)-1 {
		t.Errorf("after the outage: missed %v skipped %d; the outage had %v", p.Missed, p.Skipped, lost)
	}
}

// TestLatest agrees with the tail of Between, for intervals and cron
// schedules, across a daylight-saving change, and when fewer firings exist.
func TestLatest(t *testing.T) {
	after, upto := utc("2026-10-24T20:00:00Z"), utc("2026-10-25T03:00:00Z")
	for _, spec := range []Spec{
		{Every: 7 * time.Second},
		{Cron: "*/15 * * * *", Location: "Europe/Berlin"},
		{Cron: "30 2 * * *", Location: "Europe/Berlin"},
		{Cron: "0 0 1 1 *"}, // none in the range
	} {
		s := mustParse(t, spec)
		all := s.Between(after, upto, 100000)
		for _, n := range []int{0, 1, 3, 40, 5000} {
			got := s.Latest(after, upto, n)
			want := all[max(0, len(all)-n):]
			if n == 0 {
				want = nil
			}
			if !equalTimes(got, want) {
				t.Errorf("%v: Latest(n=%d) = %v, want %v", s, n, got, want)
			}
		}
	}
}
