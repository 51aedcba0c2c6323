package dashboard

import (
	"strings"
	"testing"
	"time"
)

func TestHistoryRing(t *testing.T) {
	t.Parallel()
	h := newHistory(3)
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		h.add(sample{at: t0.Add(time.Duration(i) * time.Second), processed: int64(i)})
	}
	ss, since := h.samples()
	if len(ss) != 3 || ss[0].processed != 2 || ss[2].processed != 4 {
		t.Errorf("samples = %+v, want the last three, oldest first", ss)
	}
	if !since.Equal(t0) {
		t.Errorf("since = %v, want the first sample's time %v", since, t0)
	}
}

// TestChartMinutes: increases land in the minute of the later sample; a
// total that went down adds nothing; an increase after a gap in the
// samples, or older than the window, is left out.
func TestChartMinutes(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC)
	ss := []sample{
		{at: now.Add(-2 * time.Hour), processed: 0},
		{at: now.Add(-90 * time.Second), processed: 100, failed: 1},
		{at: now.Add(-80 * time.Second), processed: 107, failed: 3},
		{at: now.Add(-30 * time.Second), processed: 108, failed: 3},
		{at: now.Add(-10 * time.Second), processed: 5, failed: 3}, // counters reset
		{at: now.Add(-5 * time.Second), processed: 9, failed: 4},
	}
	c := drawChart(ss, time.Hour, now)
	if c.LastOK != 5 || c.LastFail != 1 {
		t.Errorf("this minute: %d processed, %d failed; want 5 and 1", c.LastOK, c.LastFail)
	}
	svg := string(c.SVG)
	for _, want := range []string{"11:59: 7 processed", "11:59: 2 failed", "12:00: 5 processed", "12:00: 1 failed"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q:\n%s", want, svg)
		}
	}
	if c.Points != 2 {
		t.Errorf("Points = %d, want 2 minutes with samples", c.Points)
	}
}
