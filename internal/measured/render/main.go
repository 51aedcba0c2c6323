// Command render turns a log written by measured.Log into the generated
// blocks of a Markdown page:
//
//	go run ./internal/measured/render -log figures.jsonl -doc docs/scaling.md
//
// Every block between <!-- BEGIN GENERATED measured:KIND --> and
// <!-- END GENERATED measured:KIND --> whose KIND has records in the log is
// replaced by a table of them: one row per name, the number of runs, and
// for each figure its range over the runs (and, for counts of bad
// outcomes, the sum). Blocks of kinds the log does not hold are left as
// they are.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"

	"github.com/bucketq/bucketq/internal/measured"
)

// column is how a figure is shown.
type column struct {
	key, title string
	sum        bool // also show the sum over the runs
}

// layouts lists the columns of the kinds the docs show, in order; a kind
// not listed shows its figures in name order.
var layouts = map[string][]column{
	"failover": {
		{key: "acknowledged", title: "Acknowledged per run"},
		{key: "lost", title: "Acknowledged, never ran (lost)", sum: true},
		{key: "twice", title: "Ran twice", sum: true},
		{key: "failed", title: "Enqueues that failed, per run"},
	},
	"promotion": {
		{key: "resumed_ms", title: "Writes resumed after SLAVEOF NO ONE (ms)"},
	},
	"shard-kill": {
		{key: "tasks", title: "Tasks"},
		{key: "acknowledged", title: "Acknowledged"},
		{key: "rerouted", title: "Rerouted while a lane was down"},
		{key: "unrun", title: "Acknowledged, not run by the test's deadline", sum: true},
		{key: "early", title: "Ran early", sum: true},
		{key: "twice", title: "Ran twice", sum: true},
		{key: "seconds", title: "Seconds"},
	},
}

func main() {
	logPath := flag.String("log", "", "the log written by the tests ($"+measured.Env+")")
	doc := flag.String("doc", "", "the Markdown page whose generated blocks are replaced")
	flag.Parse()
	if *logPath == "" || *doc == "" {
		fmt.Fprintln(os.Stderr, "render: -log and -doc are required")
		os.Exit(2)
	}
	recs, err := read(*logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
	page, err := os.ReadFile(*doc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
	byKind := map[string][]measured.Record{}
	for _, r := range recs {
		byKind[r.Kind] = append(byKind[r.Kind], r)
	}
	done := 0
	for kind, rs := range byKind {
		var ok bool
		page, ok = measured.ReplaceBlock(page, "measured:"+kind, table(kind, rs))
		if ok {
			done++
		} else {
			fmt.Fprintf(os.Stderr, "render: %s has no block for %q\n", *doc, kind)
		}
	}
	if err := os.WriteFile(*doc, page, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "render: %d block(s) of %s from %d record(s)\n", done, *doc, len(recs))
}

func read(path string) ([]measured.Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []measured.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var r measured.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

func table(kind string, rs []measured.Record) string {
	cols := layouts[kind]
	if cols == nil {
		keys := map[string]bool{}
		for _, r := range rs {
			for k := range r.Figures {
				keys[k] = true
			}
		}
		for k := range keys {
			cols = append(cols, column{key: k, title: k})
		}
		sort.Slice(cols, func(i, j int) bool { return cols[i].key < cols[j].key })
	}
	byName := map[string][]measured.Record{}
	var names []string
	first, last := rs[0].At, rs[0].At
	for _, r := range rs {
		if byName[r.Name] == nil {
			names = append(names, r.Name)
		}
		byName[r.Name] = append(byName[r.Name], r)
		if r.At.Before(first) {
			first = r.At
		}
		if r.At.After(last) {
			last = r.At
		}
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "<!-- %d record(s) written from %s to %s UTC; do not edit: run the tests again and render (see above). -->\n\n",
		len(rs), first.Format("2006-01-02 15:04"), last.Format("2006-01-02 15:04"))
	b.WriteString("| Test | Runs |")
	for _, c := range cols {
		b.WriteString(" " + c.title + " |")
	}
	b.WriteString(" Notes |\n| --- | --- |")
	for range cols {
		b.WriteString(" --- |")
	}
	b.WriteString(" --- |\n")
	for _, n := range names {
		group := byName[n]
		fmt.Fprintf(&b, "| %s | %d |", n, len(group))
		for _, c := range cols {
			b.WriteString(" " + cell(group, c) + " |")
		}
		b.WriteString(" " + notes(group) + " |\n")
	}
	b.WriteString("\n")
	return b.String()
}

func cell(group []measured.Record, c column) string {
	lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
	n := 0
	for _, r := range group {
		v, ok := r.Figures[c.key]
		if !ok {
			continue
		}
		n++
		lo, hi, sum = math.Min(lo, v), math.Max(hi, v), sum+v
	}
	if n == 0 {
		return "n/a"
	}
	s := num(lo)
	if hi != lo {
		s += "–" + num(hi)
	}
	if c.sum && n > 1 {
		s += fmt.Sprintf(" (%s in all)", num(sum))
	}
	return s
}

func num(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func notes(group []measured.Record) string {
	seen := map[string]bool{}
	var out []string
	for _, r := range group {
		keys := make([]string, 0, len(r.Notes))
		for k := range r.Notes {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			s := k + ": " + strings.ReplaceAll(r.Notes[k], "|", "/")
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "; ")
}
