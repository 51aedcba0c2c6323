package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Result statuses.
const (
	StatusOK      = "ok"
	StatusNA      = "n/a"     // the scenario does not apply to the implementation
	StatusSkipped = "skipped" // the implementation is not implemented / unsupported here
	StatusError   = "error"
)

// Result is one figure: one metric of one case for one implementation,
// over all runs.
type Result struct {
	Scenario string         `json:"scenario"`
	Case     string         `json:"case"`
	Params   map[string]any `json:"params"`
	Impl     string         `json:"impl"`
	Metric   string         `json:"metric"`
	Unit     string         `json:"unit"`
	Status   string         `json:"status"`
	Note     string         `json:"note,omitempty"`
	Runs     []float64      `json:"runs,omitempty"`
	Median   *float64       `json:"median,omitempty"`
	Min      *float64       `json:"min,omitempty"`
	Max      *float64       `json:"max,omitempty"`
	Detail   map[string]any `json:"detail,omitempty"` // of the last run
}

// setValues stores the per-run values and their median and spread.
func (r *Result) setValues(vs []float64) {
	r.Runs = vs
	if len(vs) == 0 {
		return
	}
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	lo, hi := s[0], s[len(s)-1]
	r.Median, r.Min, r.Max = &med, &lo, &hi
}

// Report collects results and run metadata, and renders them.
type Report struct {
	mu       sync.Mutex
	Started  time.Time      `json:"started"`
	WallSecs float64        `json:"wall_seconds"`
	Meta     map[string]any `json:"meta"`
	Results  []*Result      `json:"results"`
	Derived  []Derived      `json:"derived,omitempty"`
	Notes    []string       `json:"notes,omitempty"`
	// Parts are the runs merged in (-merge), whose scenarios' results
	// replaced those of this run.
	Parts []Part `json:"parts,omitempty"`
}

// Derived is a figure computed from other results (dispatch scaling).
type Derived struct {
	What  string  `json:"what"`
	Impl  string  `json:"impl"`
	Value float64 `json:"value"`
	Text  string  `json:"text"`
}

// NewReport returns an empty report.
func NewReport(meta map[string]any) *Report {
	return &Report{Started: time.Now(), Meta: meta}
}

// Add appends a result.
func (r *Report) Add(res *Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Results = append(r.Results, res)
}

// Note appends a note (printed under the table), once.
func (r *Report) Note(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.Notes {
		if n == s {
			return
		}
	}
	r.Notes = append(r.Notes, s)
}

// Finish computes derived figures and the wall time, and notes every
// implementation that started tasks before their due time.
func (r *Report) Finish(impls []string) {
	r.WallSecs = time.Since(r.Started).Seconds()
	r.Derived = dispatchScaling(r.Results, impls)
	earliest := map[string]float64{}
	for _, res := range r.Results {
		if res.Scenario == "lateness" && res.Metric == "min" && res.Median != nil {
			earliest[res.Impl+"\x00"+res.Case] = *res.Min
		}
	}
	for _, res := range r.Results {
		if res.Scenario != "lateness" || res.Metric != "early" || res.Max == nil || *res.Max == 0 {
			continue
		}
		r.Note(fmt.Sprintf("lateness: %s started %s%% of tasks before their due time (median of runs; earliest %.0fms early)",
			res.Impl, formatValue(*res.Median, "%"), -earliest[res.Impl+"\x00"+res.Case]))
	}
}

// WriteJSON writes the report to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteTable prints one table: a row per (scenario, case, metric), a column
// per implementation; cells are "median" or, with several runs,
// "median (min–max)", or n/a / skipped / error.
func (r *Report) WriteTable(w io.Writer, impls []string) {
	type rowKey struct{ scenario, kase, metric string }
	var order []rowKey
	cells := map[rowKey]map[string]*Result{}
	for _, res := range r.Results {
		k := rowKey{res.Scenario, res.Case, res.Metric}
		if cells[k] == nil {
			cells[k] = map[string]*Result{}
			order = append(order, k)
		}
		cells[k][res.Impl] = res
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	head := []string{"scenario", "parameters", "metric"}
	head = append(head, impls...)
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	under := make([]string, len(head))
	for i, h := range head {
		under[i] = strings.Repeat("-", len(h))
	}
	fmt.Fprintln(tw, strings.Join(under, "\t")+"\t")
	var prev rowKey
	for _, k := range order {
		scen, kase := k.scenario, k.kase
		if k.scenario == prev.scenario {
			scen = ""
			if k.kase == prev.kase {
				kase = ""
			}
		} else if prev.scenario != "" {
			fmt.Fprintln(tw, strings.Repeat("\t", len(head)))
		}
		prev = k
		unit := ""
		row := []string{scen, kase, ""}
		for _, impl := range impls {
			res := cells[k][impl]
			if res == nil {
				row = append(row, "-")
				continue
			}
			unit = res.Unit
			row = append(row, cellText(res))
		}
		row[2] = metricLabel(k.metric, unit)
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	if len(r.Derived) > 0 {
		fmt.Fprintln(w, "\nDispatch rate, largest backlog vs smallest:")
		for _, d := range r.Derived {
			fmt.Fprintf(w, "  %-7s %s\n", d.Impl, d.Text)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "\nNotes:")
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
}

// metricLabel is the "metric" column: the key, with the unit unless it says it.
func metricLabel(metric, unit string) string {
	if unit == "" || metric == unit {
		return metric
	}
	return metric + " (" + unit + ")"
}

// cellText renders one cell.
func cellText(r *Result) string {
	switch r.Status {
	case StatusOK:
	case StatusError:
		return "error"
	default:
		return r.Status
	}
	if r.Median == nil {
		return "-"
	}
	s := formatValue(*r.Median, r.Unit)
	if len(r.Runs) > 1 {
		s += " (" + formatValue(*r.Min, r.Unit) + "–" + formatValue(*r.Max, r.Unit) + ")"
	}
	return s
}

// formatValue renders a value for its unit.
func formatValue(v float64, unit string) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case unit == "tasks/s" || unit == "cmds/s":
		return si(v)
	case unit == "ms":
		a := math.Abs(v)
		switch {
		case a >= 100:
			return fmt.Sprintf("%.0f", v)
		case a >= 10:
			return fmt.Sprintf("%.1f", v)
		default:
			return fmt.Sprintf("%.2f", v)
		}
	case unit == "%":
		if v != 0 && math.Abs(v) < 0.1 {
			return fmt.Sprintf("%.3f", v)
		}
		return fmt.Sprintf("%.1f", v)
	case unit == "cmds/task" || unit == "trips/task" || unit == "µs/task":
		return fmt.Sprintf("%.2f", v)
	case unit == "B/task" || unit == "tasks":
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.4g", v)
	}
}

// si renders 1234 as "1.23k", 2_500_000 as "2.50M".
func si(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%.3gk", v/1e3)
	case a >= 10:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.2g", v)
	}
}

// dispatchScaling compares, per impl, shape and dispatcher count, the
// dispatch rate at the largest backlog with the one at the smallest.
func dispatchScaling(results []*Result, impls []string) []Derived {
	type key struct {
		impl, shape string
		disp        int
	}
	type point struct {
		backlog int
		rate    float64
	}
	pts := map[key][]point{}
	var keys []key
	for _, r := range results {
		if r.Scenario != "dispatch" || r.Metric != "rate" || r.Status != StatusOK || r.Median == nil {
			continue
		}
		shape, _ := r.Params["shape"].(string)
		disp, _ := number(r.Params["dispatchers"])
		backlog, _ := number(r.Params["backlog"])
		k := key{r.Impl, shape, int(disp)}
		if pts[k] == nil {
			keys = append(keys, k)
		}
		pts[k] = append(pts[k], point{int(backlog), *r.Median})
	}
	rank := map[string]int{}
	for i, n := range impls {
		rank[n] = i
	}
	sort.SliceStable(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.impl != b.impl {
			return rank[a.impl] < rank[b.impl]
		}
		if a.shape != b.shape {
			return a.shape < b.shape
		}
		return a.disp < b.disp
	})
	var out []Derived
	for _, k := range keys {
		p := pts[k]
		if len(p) < 2 {
			continue
		}
		sort.Slice(p, func(i, j int) bool { return p[i].backlog < p[j].backlog })
		lo, hi := p[0], p[len(p)-1]
		if lo.rate == 0 {
			continue
		}
		ratio := hi.rate / lo.rate
		out = append(out, Derived{
			What:  fmt.Sprintf("dispatch %s dispatchers=%d rate(backlog=%d)/rate(backlog=%d)", k.shape, k.disp, hi.backlog, lo.backlog),
			Impl:  k.impl,
			Value: ratio,
			Text: fmt.Sprintf("%-6s dispatchers=%d: %s/s at %d → %s/s at %d (×%.2f)",
				k.shape, k.disp, si(lo.rate), lo.backlog, si(hi.rate), hi.backlog, ratio),
		})
	}
	return out
}
