package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"

	// The tests name zones and must not depend on the host's database.
	_ "time/tzdata"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func mustParse(t *testing.T, spec Spec) *Schedule {
	t.Helper()
	s, err := Parse(spec)
	if err != nil {
		t.Fatalf("Parse(%+v): %v", spec, err)
	}
	return s
}

func TestParseGood(t *testing.T) {
	from := utc("2026-06-10T12:34:56Z")
	for _, tc := range []struct {
		spec Spec
		next string // first firing after from
	}{
		{Spec{Cron: "*/5 * * * *"}, "2026-06-10T12:35:00Z"},
		{Spec{Cron: "30 * * * * *"}, "2026-06-10T12:35:30Z"}, // 6 fields: seconds first
		{Spec{Cron: "  0 0 * * *  "}, "2026-06-11T00:00:00Z"},
		{Spec{Cron: "0 9 * * mon-fri", Location: "Europe/Berlin"}, "2026-06-11T07:00:00Z"},
		{Spec{Cron: "0 0 1 jan *"}, "2027-01-01T00:00:00Z"},
		{Spec{Cron: "0 0 29 2 *"}, "2028-02-29T00:00:00Z"},
		{Spec{Cron: "@hourly"}, "2026-06-10T13:00:00Z"},
		{Spec{Cron: "@daily", Location: "America/New_York"}, "2026-06-11T04:00:00Z"},
		{Spec{Cron: "@weekly"}, "2026-06-14T00:00:00Z"},
		{Spec{Cron: "@monthly"}, "2026-07-01T00:00:00Z"},
		{Spec{Cron: "@yearly"}, "2027-01-01T00:00:00Z"},
		{Spec{Cron: "@every 90s"}, "2026-06-10T12:36:00Z"},
		{Spec{Cron: "@every 1h"}, "2026-06-10T13:00:00Z"},
		{Spec{Every: time.Minute}, "2026-06-10T12:35:00Z"},
		{Spec{Every: 7 * time.Second}, "2026-06-10T12:35:03Z"}, // 1781094903 = 7 × 254442129
		{Spec{Every: 24 * time.Hour}, "2026-06-11T00:00:00Z"},
		{Spec{Cron: "0 12 * * *", Location: "Asia/Kolkata"}, "2026-06-11T06:30:00Z"},
	} {
		s := mustParse(t, tc.spec)
		if got := s.Next(from); !got.Equal(utc(tc.next)) {
			t.Errorf("%+v: Next(%v) = %v, want %s", tc.spec, from, got.UTC(), tc.next)
		}
	}
}

func TestParseBad(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string // in the message
	}{
		{Spec{}, "no schedule"},
		{Spec{Cron: "   "}, "no schedule"},
		{Spec{Cron: "* * * * *", Every: time.Minute}, "choose one"},
		{Spec{Cron: "* * * *"}, "expected 5 to 6 fields, found 4"},
		{Spec{Cron: "* * * * * * *"}, "expected 5 to 6 fields, found 7"},
		{Spec{Cron: "60 * * * *"}, "above maximum"},
		{Spec{Cron: "* 24 * * *"}, "above maximum"},
		{Spec{Cron: "* * 0 * *"}, "below minimum"},
		{Spec{Cron: "*/0 * * * *"}, "step of range"},
		{Spec{Cron: "5-1 * * * *"}, "beyond end of range"},
		{Spec{Cron: "a * * * *"}, "failed to parse int"},
		{Spec{Cron: "* * * foo *"}, "failed to parse int"},
		{Spec{Cron: "0 0 30 2 *"}, "never fires"},
		{Spec{Cron: "0 0 31 4,6,9,11 *"}, "never fires"},
		{Spec{Cron: "@fortnightly"}, "unrecognized descriptor"},
		{Spec{Cron: "@every"}, "@every <duration>"},
		{Spec{Cron: "@every 1x"}, "unknown unit"},
		{Spec{Cron: "@every 500ms"}, "at least 1s"},
		{Spec{Cron: "@every 1500ms"}, "whole seconds"},
		{Spec{Cron: "@every 1m", Location: "Europe/Berlin"}, "no meaning for a fixed interval"},
		{Spec{Cron: "TZ=Europe/Berlin 0 * * * *"}, "give the time zone as the location"},
		{Spec{Cron: "CRON_TZ=UTC"}, "give the time zone as the location"},
		{Spec{Cron: "0 * * * *", Location: "Mars/Olympus_Mons"}, `unknown time zone "Mars/Olympus_Mons"`},
		{Spec{Cron: "0 * * * *", Location: "Local"}, "host's zone differs"},
		{Spec{Cron: "0 * * * *", Location: "../../etc/passwd"}, "time zone"},
		{Spec{Every: -time.Second}, "at least 1s"},
		{Spec{Every: time.Millisecond}, "at least 1s"},
		{Spec{Every: 2500 * time.Millisecond}, "whole seconds"},
		{Spec{Every: time.Minute, Location: "UTC"}, "no meaning for a fixed interval"},
		{Spec{Cron: strings.Repeat("1,", 600) + "1 * * * *"}, "at most 1024"},
	} {
		s, err := Parse(tc.spec)
		if err == nil {
			t.Errorf("%+v: parsed as %v, want an error", tc.spec, s)
			continue
		}
		if !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%+v: %v does not wrap ErrInvalidSpec", tc.spec, err)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %q, want it to say %q", tc.spec, err, tc.want)
		}
	}
}

func TestFingerprint(t *testing.T) {
	fp := func(spec Spec) string { return mustParse(t, spec).Fingerprint() }
	same := [][]Spec{
		{{Cron: "0 * * * *"}, {Cron: "0 0 * * * *"}, {Cron: "@hourly"}, {Cron: "0  *  * * *"}, {Cron: "0 * * * *", Location: "UTC"}},
		{{Cron: "@every 90s"}, {Every: 90 * time.Second}, {Cron: "@every 1m30s"}},
		{{Cron: "0 0 * * 1-5"}, {Cron: "0 0 * * mon-fri"}, {Cron: "0 0 * * 1,2,3,4,5"}},
	}
	seen := map[string]int{}
	for i, group := range same {
		want := fp(group[0])
		if len(want) != 16 {
			t.Errorf("fingerprint %q: want 16 hex digits", want)
		}
		for _, spec := range group[1:] {
			if got := fp(spec); got != want {
				t.Errorf("%+v: fingerprint %s, want %s as for %+v", spec, got, want, group[0])
			}
		}
		if j, ok := seen[want]; ok {
			t.Errorf("groups %d and %d share fingerprint %s", j, i, want)
		}
		seen[want] = i
	}
	differ := []Spec{
		{Cron: "0 * * * *", Location: "Europe/Berlin"},
		{Cron: "0 * * * *", Location: "America/New_York"},
		{Cron: "1 * * * *"},
		{Cron: "0 0 * * *"},
		{Every: time.Hour},
		{Every: 91 * time.Second},
		{Cron: "0 0 * * 0"},
	}
	for _, spec := range differ {
		got := fp(spec)
		if j, ok := seen[got]; ok {
			t.Errorf("%+v: fingerprint %s equals group %d's", spec, got, j)
		}
		seen[got] = -1
	}
	// Deterministic: a second parse agrees.
	spec := Spec{Cron: "0 2 * * *", Location: "Europe/Berlin"}
	if a, b := fp(spec), fp(spec); a != b {
		t.Errorf("two parses of one spec give two fingerprints: %s, %s", a, b)
	}
}

func TestEveryAnchoredAtEpoch(t *testing.T) {
	s := mustParse(t, Spec{Every: 10 * time.Second})
	for _, tc := range []struct{ after, want string }{
		{"2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z"},
		{"2026-01-01T00:00:09.999Z", "2026-01-01T00:00:10Z"},
		{"2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z"}, // strictly after
		{"1969-12-31T23:59:55Z", "1970-01-01T00:00:00Z"}, // before the epoch
		{"1969-12-31T23:59:45.5Z", "1969-12-31T23:59:50Z"},
	} {
		if got := s.Next(utc(tc.after)); !got.Equal(utc(tc.want)) {
			t.Errorf("Next(%s) = %v, want %s", tc.after, got, tc.want)
		}
	}
	// Processes in other zones compute the same instants.
	berlin, _ := time.LoadLocation("Europe/Berlin")
	a := utc("2026-03-29T00:59:53Z")
	if !s.Next(a).Equal(s.Next(a.In(berlin))) {
		t.Error("Next depends on the zone of its argument")
	}
}

func TestBetween(t *testing.T) {
	s := mustParse(t, Spec{Cron: "*/15 * * * *"})
	from, to := utc("2026-01-01T10:00:00Z"), utc("2026-01-01T11:00:00Z")
	got := s.Between(from, to, 100)
	want := []string{"10:15", "10:30", "10:45", "11:00"} // (from, to]
	if len(got) != len(want) {
		t.Fatalf("Between = %v, want %v", got, want)
	}
	for i, w := range want {
		if !got[i].Equal(utc("2026-01-01T" + w + ":00Z")) {
			t.Errorf("Between[%d] = %v, want %s", i, got[i], w)
		}
	}
	if got := s.Between(from, to, 2); len(got) != 2 || !got[1].Equal(utc("2026-01-01T10:30:00Z")) {
		t.Errorf("Between with max 2 = %v", got)
	}
	if got := s.Between(from, to, 0); len(got) != 0 {
		t.Errorf("Between with max 0 = %v", got)
	}
	if got := s.Between(to, from, 10); len(got) != 0 {
		t.Errorf("Between of an empty range = %v", got)
	}
}

// TestDaylightSaving pins the firings across the 2026 changes in Berlin
// (29 March 02:00 CET -> 03:00 CEST, 25 October 03:00 CEST -> 02:00 CET)
// and New York (8 March 02:00 EST -> 03:00 EDT, 1 November 02:00 EDT ->
// 01:00 EST). Times are UTC.
func TestDaylightSaving(t *testing.T) {
	for _, tc := range []struct {
		name, zone, cron, from, to string
		want                       []string
	}{
		{"berlin daily 02:30 spring: the gap fires at its end", "Europe/Berlin", "30 2 * * *",
			"2026-03-27T12:00:00Z", "2026-03-31T00:00:00Z",
			[]string{"2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"}},
		{"berlin daily 02:30 fall: the repeated time fires once", "Europe/Berlin", "30 2 * * *",
			"2026-10-23T12:00:00Z", "2026-10-27T00:00:00Z",
			[]string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"berlin daily 02:30 fall, from inside the repeated hour", "Europe/Berlin", "30 2 * * *",
			"2026-10-25T01:10:00Z", "2026-10-27T00:00:00Z",
			[]string{"2026-10-26T01:30:00Z"}},
		{"berlin daily 02:00 spring (the very start of the gap)", "Europe/Berlin", "0 2 * * *",
			"2026-03-28T12:00:00Z", "2026-03-30T12:00:00Z",
			[]string{"2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"}},
		{"berlin hourly spring", "Europe/Berlin", "0 * * * *",
			"2026-03-28T23:30:00Z", "2026-03-29T02:30:00Z",
			[]string{"2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"}},
		{"berlin hourly fall: the repeated hour fires twice", "Europe/Berlin", "0 * * * *",
			"2026-10-24T22:30:00Z", "2026-10-25T02:30:00Z",
			[]string{"2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"}},
		{"berlin */15 spring: 15 real minutes apart", "Europe/Berlin", "*/15 * * * *",
			"2026-03-29T00:30:00Z", "2026-03-29T01:30:00Z",
			[]string{"2026-03-29T00:45:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z", "2026-03-29T01:30:00Z"}},
		{"berlin */15 fall: 15 real minutes apart", "Europe/Berlin", "*/15 * * * *",
			"2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z",
			[]string{"2026-10-25T00:45:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:15:00Z", "2026-10-25T01:30:00Z"}},
		{"berlin */15 during 02h only, spring: the whole gap fires once", "Europe/Berlin", "*/15 2 * * *",
			"2026-03-28T23:00:00Z", "2026-03-29T23:00:00Z",
			[]string{"2026-03-29T01:00:00Z"}},
		{"berlin */15 during 02h only, fall: first occurrences only", "Europe/Berlin", "*/15 2 * * *",
			"2026-10-24T23:00:00Z", "2026-10-25T23:00:00Z",
			[]string{"2026-10-25T00:00:00Z", "2026-10-25T00:15:00Z", "2026-10-25T00:30:00Z", "2026-10-25T00:45:00Z"}},
		{"new york daily 02:30 spring", "America/New_York", "30 2 * * *",
			"2026-03-06T12:00:00Z", "2026-03-10T00:00:00Z",
			[]string{"2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"}},
		{"new york daily 01:30 fall", "America/New_York", "30 1 * * *",
			"2026-10-30T12:00:00Z", "2026-11-03T00:00:00Z",
			[]string{"2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
		{"new york daily 02:30 fall (not repeated there)", "America/New_York", "30 2 * * *",
			"2026-10-31T12:00:00Z", "2026-11-02T12:00:00Z",
			[]string{"2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z"}},
		{"new york hourly spring", "America/New_York", "0 * * * *",
			"2026-03-08T05:30:00Z", "2026-03-08T08:30:00Z",
			[]string{"2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"}},
		{"new york hourly fall", "America/New_York", "0 * * * *",
			"2026-11-01T04:30:00Z", "2026-11-01T07:30:00Z",
			[]string{"2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"}},
		{"new york */15 spring", "America/New_York", "*/15 * * * *",
			"2026-03-08T06:30:00Z", "2026-03-08T07:30:00Z",
			[]string{"2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z", "2026-03-08T07:30:00Z"}},
		{"new york */15 fall", "America/New_York", "*/15 * * * *",
			"2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z",
			[]string{"2026-11-01T05:45:00Z", "2026-11-01T06:00:00Z", "2026-11-01T06:15:00Z", "2026-11-01T06:30:00Z"}},
		{"santiago midnight gap: @daily fires at 01:00", "America/Santiago", "@daily",
			"2026-09-05T12:00:00Z", "2026-09-07T12:00:00Z",
			[]string{"2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, Spec{Cron: tc.cron, Location: tc.zone})
			got := s.Between(utc(tc.from), utc(tc.to), 100)
			var gotS []string
			for _, g := range got {
				gotS = append(gotS, g.UTC().Format(time.RFC3339))
			}
			if strings.Join(gotS, " ") != strings.Join(tc.want, " ") {
				t.Errorf("firings\n got %v\nwant %v", gotS, tc.want)
			}
			for _, g := range got {
				if g.Location() != s.Location() {
					t.Errorf("firing %v not in the schedule's zone", g)
				}
			}
		})
	}
}

// TestCronMatchesOracle checks Next against a second-by-second walk
// around every offset change of 2026 in zones with hour, half-hour and
// midnight changes: the walk applies the package doc's rule directly to
// each second's wall-clock time.
func TestCronMatchesOracle(t *testing.T) {
	zones := []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Europe/London", "Asia/Kolkata"}
	specs := []string{"30 2 * * *", "0 2 * * *", "0 * * * *", "*/15 * * * *", "*/15 2 * * *", "@daily", "30 1 * * *", "45 */2 * * *", "0 30 1-3 * * *", "*/20 0-1 * * *"}
	for _, zone := range zones {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		// The changes of 2026, or one ordinary day for a zone without.
		windows := []time.Time{utc("2026-06-01T00:00:00Z")}
		for t0, n := utc("2026-01-01T00:00:00Z").In(loc), 0; n < 2; n++ {
			_, end := t0.ZoneBounds()
			if end.IsZero() || end.Year() > 2026 {
				break
			}
			windows = append(windows, end)
			t0 = end.In(loc)
		}
		if zone != "Asia/Kolkata" && len(windows) != 3 {
			t.Fatalf("%s: found %d offset changes in 2026, want 2", zone, len(windows)-1)
		}
		for _, spec := range specs {
			s := mustParse(t, Spec{Cron: spec, Location: zone})
			for _, at := range windows {
				from, to := at.Add(-2*time.Hour), at.Add(2*time.Hour)
				got := s.Between(from, to, 1000)
				want := oracle(s, loc, from, to)
				if !equalTimes(got, want) {
					t.Errorf("%s in %s around %v:\n got %v\nwant %v", spec, zone, at, got, want)
				}
			}
		}
	}
}

// oracle walks (from, to] second by second. from must not lie in a
// repeated hour.
func oracle(s *Schedule, loc *time.Location, from, to time.Time) []time.Time {
	wall := func(i time.Time) time.Time {
		_, off := i.In(loc).Zone()
		return i.Add(time.Duration(off) * time.Second).UTC()
	}
	var out []time.Time
	hw := wall(from)
	for i := from.Add(time.Second); !i.After(to); i = i.Add(time.Second) {
		w := wall(i)
		if !s.timeOfDay {
			if matches(s, w) {
				out = append(out, i)
			}
			continue
		}
		if !w.After(hw) {
			continue // a repeated wall time: it fired at its first occurrence
		}
		fire := false
		for g := hw.Add(time.Second); !g.After(w); g = g.Add(time.Second) {
			fire = fire || matches(s, g) // g < w: skipped by a gap
		}
		if fire {
			out = append(out, i)
		}
		hw = w
	}
	return out
}

// matches applies the cron fields to a wall-clock time (read as UTC), as
// cron defines them: day of month and day of week are or-ed when both are
// restricted.
func matches(s *Schedule, w time.Time) bool {
	c := s.spec
	bit := func(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }
	const star = 1 << 63
	dom, dow := bit(c.Dom, w.Day()), bit(c.Dow, int(w.Weekday()))
	day := dom || dow
	if c.Dom&star != 0 || c.Dow&star != 0 {
		day = dom && dow
	}
	return day && bit(c.Month, int(w.Month())) && bit(c.Hour, w.Hour()) && bit(c.Minute, w.Minute()) && bit(c.Second, w.Second())
}

func equalTimes(a, b []time.Time) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func TestNextNeverFiresAgain(t *testing.T) {
	// 29 February on a Monday, in a stretch of years without one: the
	// parser's five-year search finds nothing and Next says so.
	s := mustParse(t, Spec{Cron: "0 0 29 2 *"})
	if got := s.Next(utc("2096-03-01T00:00:00Z")); !got.IsZero() {
		t.Errorf("Next after the last 29 February within reach = %v, want the zero time", got)
	}
	if got := s.Between(utc("2096-03-01T00:00:00Z"), utc("2200-01-01T00:00:00Z"), 10); len(got) != 0 {
		t.Errorf("Between = %v, want none", got)
	}
}
