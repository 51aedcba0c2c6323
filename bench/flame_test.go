package main

import (
	"bytes"
	"encoding/xml"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
)

// TestFlame renders a profile of known stacks: main→a→leaf (3 samples'
// worth) and main→b (1), and checks the graph is well-formed SVG whose
// boxes are as wide as their shares, callers below callees.
func TestFlame(t *testing.T) {
	fn := func(id uint64, name string) *profile.Function { return &profile.Function{ID: id, Name: name} }
	fMain, fA, fB, fLeaf := fn(1, "main.main"), fn(2, "github.com/bucketq/bucketq/txn.a"), fn(3, "runtime.b"), fn(4, "syscall.leaf")
	loc := func(id uint64, f ...*profile.Function) *profile.Location {
		l := &profile.Location{ID: id}
		for _, x := range f {
			l.Line = append(l.Line, profile.Line{Function: x})
		}
		return l
	}
	lMain, lA, lB := loc(1, fMain), loc(2, fLeaf, fA), loc(3, fB) // lA: leaf inlined into a
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			{Location: []*profile.Location{lA, lMain}, Value: []int64{1, 300}},
			{Location: []*profile.Location{lB, lMain}, Value: []int64{1, 100}},
		},
		Location: []*profile.Location{lMain, lA, lB},
		Function: []*profile.Function{fMain, fA, fB, fLeaf},
	}
	var buf bytes.Buffer
	if err := writeFlame(&buf, p, "test <profile>"); err != nil {
		t.Fatal(err)
	}
	svg := buf.String()
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := d.Token(); err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not well-formed XML: %v\n%s", err, svg)
			}
			break
		}
	}
	box := regexp.MustCompile(`<title>([^<]+) \(([0-9.]+)%\)</title><rect x="([0-9.]+)" y="([0-9.]+)" width="([0-9.]+)"`)
	type rect struct{ share, x, y, w float64 }
	got := map[string]rect{}
	for _, m := range box.FindAllStringSubmatch(svg, -1) {
		f := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
		got[m[1]] = rect{f(m[2]), f(m[3]), f(m[4]), f(m[5])}
	}
	want := map[string]float64{"all": 100, "main.main": 100, "github.com/bucketq/bucketq/txn.a": 75, "syscall.leaf": 75, "runtime.b": 25}
	for name, share := range want {
		r, ok := got[name]
		if !ok {
			t.Fatalf("no box for %s in\n%s", name, svg)
		}
		if r.share != share || r.w < flameWidth*share/100-0.01 || r.w > flameWidth*share/100+0.01 {
			t.Errorf("%s: share %.2f%% width %.2f, want %.0f%% of %.0f", name, r.share, r.w, share, flameWidth)
		}
	}
	if !(got["all"].y > got["main.main"].y && got["main.main"].y > got["github.com/bucketq/bucketq/txn.a"].y &&
		got["github.com/bucketq/bucketq/txn.a"].y > got["syscall.leaf"].y) {
		t.Errorf("callers must be below callees: %+v", got)
	}
	if got["runtime.b"].x <= got["github.com/bucketq/bucketq/txn.a"].x {
		t.Errorf("callees must be in name order: %+v", got)
	}
	if !strings.Contains(svg, "test &lt;profile&gt;") {
		t.Error("the title is not escaped")
	}
	if flameKind("github.com/bucketq/bucketq/txn.a") != 0 || flameKind("syscall.leaf") != 2 || flameKind("runtime.b") != 3 {
		t.Error("frames coloured by the wrong kind")
	}
}
