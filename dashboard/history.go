package dashboard

import (
	"fmt"
	"html/template"
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

// chart draws the per-minute rates of processed and failed tasks between
// consecutive samples as an inline SVG (no script, no external request).
type chart struct {
	SVG              template.HTML
	Since            time.Time
	Points           int
	LastOK, LastFail float64 // per minute, latest interval
}

func drawChart(ss []sample, window time.Duration, now time.Time) chart {
	const w, h, left, bottom, top = 720.0, 180.0, 44.0, 22.0, 8.0
	type pt struct {
		t        time.Time
		ok, fail float64
	}
	var pts []pt
	for i := 1; i < len(ss); i++ {
		dt := ss[i].at.Sub(ss[i-1].at).Minutes()
		if dt <= 0 {
			continue
		}
		// A counter that went down (keys deleted) draws as zero.
		ok := max(0, float64(ss[i].processed-ss[i-1].processed)/dt)
		fail := max(0, float64(ss[i].failed-ss[i-1].failed)/dt)
		pts = append(pts, pt{ss[i].at, ok, fail})
	}
	top1 := 1.0
	for _, p := range pts {
		top1 = max(top1, p.ok, p.fail)
	}
	top1 = niceCeil(top1)
	start := now.Add(-window)
	x := func(t time.Time) float64 {
		return left + (w-left-4)*float64(t.Sub(start))/float64(window)
	}
	y := func(v float64) float64 { return top + (h-top-bottom)*(1-v/top1) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %g %g" role="img" aria-label="tasks per minute">`, w, h)
	for i := 0; i <= 4; i++ {
		v := top1 * float64(i) / 4
		fmt.Fprintf(&b, `<line class="grid" x1="%g" x2="%g" y1="%.1f" y2="%.1f"/>`, left, w-4, y(v), y(v))
		fmt.Fprintf(&b, `<text class="axis" x="%g" y="%.1f" text-anchor="end">%s</text>`, left-6, y(v)+4, short(v))
	}
	for m := 0; m <= 60; m += 10 {
		t := start.Add(time.Duration(m) * window / 60)
		label := fmt.Sprintf("-%dm", 60-m)
		if m == 60 {
			label = "now"
		}
		fmt.Fprintf(&b, `<text class="axis" x="%.1f" y="%g" text-anchor="middle">%s</text>`, x(t), h-4, label)
	}
	line := func(class string, v func(pt) float64) {
		if len(pts) == 0 {
			return
		}
		fmt.Fprintf(&b, `<polyline class="%s" points="`, class)
		for _, p := range pts {
			if p.t.Before(start) {
				continue
			}
			fmt.Fprintf(&b, "%.1f,%.1f ", x(p.t), y(v(p)))
		}
		b.WriteString(`"/>`)
	}
	line("ok", func(p pt) float64 { return p.ok })
	line("fail", func(p pt) float64 { return p.fail })
	b.WriteString(`</svg>`)
	c := chart{SVG: template.HTML(b.String()), Points: len(pts)}
	if len(ss) > 0 {
		c.Since = ss[0].at
	}
	if len(pts) > 0 {
		c.LastOK, c.LastFail = pts[len(pts)-1].ok, pts[len(pts)-1].fail
	}
	return c
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func short(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v == float64(int64(v)):
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.1f", v)
}
