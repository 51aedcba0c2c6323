package dashboard

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"net/url"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bucketq/bucketq/engine"
)

// maxShownPayload bounds the payload shown on a task page.
const maxShownPayload = 64 << 10

func (d *Dashboard) funcs() template.FuncMap {
	return template.FuncMap{
		"ago":       func(t time.Time) string { return relative(t, d.opts.Now()) },
		"abs":       func(t time.Time) string { return absTime(t) },
		"dur":       duration,
		"preview":   preview,
		"vis":       visible,
		"qpath":     func(q string) string { return "/queues/" + url.PathEscape(q) },
		"tpath":     func(id string) string { return "/tasks/" + url.PathEscape(id) },
		"wfpath":    func(id string) string { return "/workflows/" + url.PathEscape(id) },
		"verbLabel": func(v engine.Action) string { return verbLabel[v] },
		"danger":    destructive,
		"join":      strings.Join,
		"lower":     strings.ToLower,
		"isZero":    func(t time.Time) bool { return t.IsZero() },
		"add":       func(a, b int) int { return a + b },
		"num":       func(n int64) string { return group(n) },
		"int64":     func(n int) int64 { return int64(n) },
	}
}

func absTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
}

// relative is "3m ago" or "in 2h".
func relative(t, now time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + duration(-d)
	}
	if d < time.Second {
		return "just now"
	}
	return duration(d) + " ago"
}

// duration is a short human form: 850ms, 42s, 5m10s, 3h5m, 2d4h.
func duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func group(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + group(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// hidden says whether r displays as something else than itself, or as
// nothing: a C0 control (tab and newlines aside), DEL, a C1 control, a
// bidi control, an invisible format mark, a line or paragraph separator.
func hidden(r rune) bool {
	switch {
	case r < 0x20:
		return r != '\t' && r != '\n' && r != '\r'
	case r >= 0x7f && r <= 0x9f, r == 0x061c, r >= 0x200b && r <= 0x200f, r >= 0x202a && r <= 0x202e,
		r >= 0x2066 && r <= 0x2069, r == 0x2028, r == 0x2029, r == 0x2060, r == 0xfeff:
		return true
	}
	return false
}

// visible is s with each rune that hides itself (see hidden) written out
// as \uXXXX, so that "invoice\u202Efdp.exe" shows as that, not as
// "invoiceexe.pdf". Every type, queue, id, error, payload and other text
// from tasks goes through it on the pages (the template func "vis").
func visible(s string) string {
	i := strings.IndexFunc(s, hidden)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for _, r := range s[i:] {
		if hidden(r) {
			fmt.Fprintf(&b, "\\u%04X", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// preview is the payload's first bytes as text, or as hex when binary,
// control and bidi characters shown (see visible).
func preview(p []byte) string {
	const n = 120
	if len(p) == 0 {
		return "(empty)"
	}
	cut := p[:min(len(p), n)]
	if isText(cut) {
		s := visible(strings.Join(strings.Fields(string(cut)), " "))
		if len(p) > n {
			s += "…"
		}
		return s
	}
	s := hex.EncodeToString(cut[:min(len(cut), 32)])
	if len(p) > 32 {
		s += "…"
	}
	return "0x" + s
}

func isText(p []byte) bool {
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		if r == utf8.RuneError && size <= 1 {
			return len(p) < 4 // a rune cut at the end
		}
		if r < 0x20 && r != '\n' && r != '\r' && r != '\t' {
			return false
		}
		p = p[size:]
	}
	return true
}

// prettyPayload is the payload indented when it is JSON, a hex dump
// when it is binary, and as it is when it is other text; kind says which.
func prettyPayload(p []byte) (shown string, kind string) {
	cut, more := p, ""
	if len(p) > maxShownPayload {
		cut = p[:maxShownPayload]
		more = fmt.Sprintf("\n… %d more bytes not shown", len(p)-maxShownPayload)
	}
	if json.Valid(p) && len(p) <= maxShownPayload {
		var b bytes.Buffer
		if json.Indent(&b, p, "", "  ") == nil {
			return visible(b.String()), "JSON"
		}
	}
	if isText(cut) {
		return visible(string(cut)) + more, "text"
	}
	return hex.Dump(cut) + more, "binary, as a hex dump"
}

// event is one line of a task's timeline.
type event struct {
	At   time.Time
	What string
}

// timeline orders what the record's times say happened.
func timeline(t *engine.TaskInfo) []event {
	var ev []event
	add := func(at time.Time, what string) {
		if !at.IsZero() {
			ev = append(ev, event{at, what})
		}
	}
	add(t.Created, "created")
	switch t.State {
	case engine.StateScheduled, engine.StateReady:
		add(t.Due, "due")
	case engine.StateRetrying:
		add(t.Due, fmt.Sprintf("next attempt (%d of %d)", t.Attempts+1, t.MaxAttempts))
	default:
		if !t.Due.Equal(t.Created) {
			add(t.Due, "due")
		}
	}
	if !t.Started.IsZero() {
		what := "started"
		if t.Attempts > 0 {
			what = fmt.Sprintf("last run started (attempt %d)", t.Attempt)
			if t.State == engine.StateDead || t.State == engine.StateDone || t.State == engine.StateRetrying {
				what = "last run started"
			}
		}
		if t.Worker != "" && t.State == engine.StateRunning {
			what += " on " + t.Worker
		}
		add(t.Started, what)
	}
	switch t.State {
	case engine.StateDone:
		add(t.Finished, "succeeded")
	case engine.StateDead:
		add(t.Finished, "moved to the dead letters")
	case engine.StateCancelled:
		add(t.Finished, "cancelled")
	}
	sort.SliceStable(ev, func(i, j int) bool { return ev[i].At.Before(ev[j].At) })
	return ev
}
