package dashboard

import (
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sample is the processed and failed totals of every queue at one time.
type sample struct {
	at                time.Time
	processed, failed int64
}

// history is a ring of samples covering the last window.
type history struct {
	mu    sync.Mutex
	ring  []sample
	next  int
	full  bool
	since time.Time // first sample
}

func newHistory(n int) *history { return &history{ring: make([]sample, n)} }

func (h *history) add(s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() {
		h.since = s.at
	}
	h.ring[h.next] = s
	h.next = (h.next + 1) % len(h.ring)
	if h.next == 0 {
		h.full = true
	}
}

// samples returns the samples oldest first.
func (h *history) samples() ([]sample, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.full {
		return append([]sample(nil), h.ring[:h.next]...), h.since
	}
	return append(append([]sample(nil), h.ring[h.next:]...), h.ring[:h.next]...), h.since
}

// chart draws the processed and failed tasks of each minute of the
// window (the increase of the totals between consecutive samples less
// than a minute apart, put in the minute of the later sample) as bars in an inline SVG: no script, no
// external request.
type chart struct {
	SVG              template.HTML
	Points           int   // minutes with a sample
	LastOK, LastFail int64 // the current minute so far
}

func drawChart(ss []sample, window time.Duration, now time.Time) chart {
	const w, h, left, bottom, top = 1200.0, 200.0, 48.0, 22.0, 8.0
	const n = 60
	step := window / n
	start := now.Add(-window).Truncate(step).Add(step) // the first whole minute shown
	var ok, fail [n]int64
	var seen [n]bool
	for i := 1; i < len(ss); i++ {
		k := int(ss[i].at.Sub(start) / step)
		if k < 0 || k >= n || ss[i].at.Sub(ss[i-1].at) > step {
			// Out of the window, or after a gap in the sampling: the
			// increase cannot be placed in one minute.
			continue
		}
		seen[k] = true
		// A total that went down (keys deleted) adds nothing.
		ok[k] += max(0, ss[i].processed-ss[i-1].processed)
		fail[k] += max(0, ss[i].failed-ss[i-1].failed)
	}
	peak := int64(1)
	c := chart{LastOK: ok[n-1], LastFail: fail[n-1]}
	for k := range n {
		peak = max(peak, ok[k], fail[k])
		if seen[k] {
			c.Points++
		}
	}
	topV, ticks := niceCeil(float64(peak))
	slot := (w - left - 4) / n
	y := func(v float64) float64 { return top + (h-top-bottom)*(1-v/topV) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %g %g" role="img" aria-label="tasks processed and failed per minute" data-points="%d">`, w, h, c.Points)
	for i := 0; i <= ticks; i++ {
		v := topV * float64(i) / float64(ticks)
		fmt.Fprintf(&b, `<line class="grid" x1="%g" x2="%g" y1="%.1f" y2="%.1f"/>`, left, w-4, y(v), y(v))
		fmt.Fprintf(&b, `<text class="axis" x="%g" y="%.1f" text-anchor="end">%s</text>`, left-6, y(v)+4, short(v))
	}
	for m := 0; m <= n; m += 10 {
		label, anchor := fmt.Sprintf("-%dm", n-m), "middle"
		if m == n {
			label, anchor = "now", "end"
		}
		fmt.Fprintf(&b, `<text class="axis" x="%.1f" y="%g" text-anchor="%s">%s</text>`, left+slot*float64(m), h-4, anchor, label)
	}
	for k := range n {
		x := left + slot*float64(k)
		at := start.Add(time.Duration(k) * step).UTC().Format("15:04")
		if ok[k] > 0 {
			fmt.Fprintf(&b, `<rect class="ok" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d processed</title></rect>`,
				x+1, y(float64(ok[k])), slot-2, y(0)-y(float64(ok[k])), at, ok[k])
		}
		if fail[k] > 0 {
			fmt.Fprintf(&b, `<rect class="fail" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d failed</title></rect>`,
				x+slot/4, y(float64(fail[k])), slot/2, y(0)-y(float64(fail[k])), at, fail[k])
		}
	}
	b.WriteString(`</svg>`)
	c.SVG = template.HTML(b.String())
	return c
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten and says how
// many grid steps divide it evenly.
func niceCeil(v float64) (float64, int) {
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p, map[float64]int{1: 5, 2: 4, 5: 5, 10: 5}[m]
		}
	}
	return 10 * p, 5
}

func short(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
