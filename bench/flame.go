package main

import (
	"flag"
	"fmt"
	"hash/fnv"
	"html"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/google/pprof/profile"
)

// runFlame is `bench flame PROFILE OUT.svg`: it renders a CPU profile (as
// -cpuprofile, go test -cpuprofile or runtime/pprof write one) as a flame
// graph in SVG. Each frame is a box as wide as the share of samples whose
// stacks pass through it, its callers below it and its callees above,
// callees ordered by name; boxes are coloured by where the code lives
// (this project, the Redis client, the Go runtime, system calls, the rest
// of the standard library), and hovering one shows its full name and
// share. scripts/profiles.sh renders the e2e profiles this way.
func runFlame(args []string) int {
	fs := flag.NewFlagSet("flame", flag.ContinueOnError)
	title := fs.String("title", "", "title written above the graph (default: the profile's file name)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: bench flame [-title T] PROFILE OUT.svg")
		return 2
	}
	in, out := fs.Arg(0), fs.Arg(1)
	if *title == "" {
		*title = in
	}
	if err := writeFlameFile(in, out, *title); err != nil {
		fmt.Fprintln(os.Stderr, "bench flame:", err)
		return 1
	}
	return 0
}

func writeFlameFile(in, out, title string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	w, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := writeFlame(w, p, title); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// flameNode is one frame of the merged stacks: the samples whose stacks
// pass through it (value) and the frames called from it.
type flameNode struct {
	name     string
	value    int64
	children map[string]*flameNode
}

func (n *flameNode) child(name string) *flameNode {
	if n.children == nil {
		n.children = map[string]*flameNode{}
	}
	c := n.children[name]
	if c == nil {
		c = &flameNode{name: name}
		n.children[name] = c
	}
	return c
}

// flameTree merges p's stacks, outermost caller first, weighing each
// sample by its last value (CPU time in a CPU profile). Inlined calls are
// frames of their own, as pprof shows them.
func flameTree(p *profile.Profile) *flameNode {
	root := &flameNode{name: "all"}
	vi := len(p.SampleType) - 1
	for _, s := range p.Sample {
		if vi < 0 || vi >= len(s.Value) || s.Value[vi] <= 0 {
			continue
		}
		v := s.Value[vi]
		root.value += v
		n := root
		for i := len(s.Location) - 1; i >= 0; i-- {
			loc := s.Location[i]
			if len(loc.Line) == 0 {
				n = n.child(fmt.Sprintf("0x%x", loc.Address))
				n.value += v
				continue
			}
			for j := len(loc.Line) - 1; j >= 0; j-- {
				name := "?"
				if fn := loc.Line[j].Function; fn != nil {
					name = fn.Name
				}
				n = n.child(name)
				n.value += v
			}
		}
	}
	return root
}

const (
	flameWidth  = 1200.0
	flameRow    = 16.0
	flameTop    = 48.0 // title and legend
	flameMinBox = 0.3  // px: narrower frames (and their callees) are left out
	flameChar   = 6.6  // px per character of the 11px font, to fit labels
)

// flameKinds colour frames by where their code lives, first match wins.
var flameKinds = []struct {
	label, color string
	match        func(string) bool
}{
	{"this project", "#e8a33c", func(s string) bool { return strings.Contains(s, "bucketq/") }},
	{"Redis client (redigo)", "#5fa8d3", func(s string) bool { return strings.Contains(s, "gomodule/redigo") }},
	{"system calls", "#d9534f", func(s string) bool {
		return strings.HasPrefix(s, "syscall.") || strings.HasPrefix(s, "internal/runtime/syscall") || strings.HasPrefix(s, "internal/poll.")
	}},
	{"Go runtime (scheduler, allocation, GC)", "#9b8fd1", func(s string) bool {
		return strings.HasPrefix(s, "runtime.") || strings.HasPrefix(s, "internal/runtime")
	}},
	{"other code (standard library, harness, libraries)", "#8cc084", func(string) bool { return true }},
}

func flameKind(name string) int {
	for i, k := range flameKinds {
		if k.match(name) {
			return i
		}
	}
	return len(flameKinds) - 1
}

// writeFlame writes the flame graph of p.
func writeFlame(w io.Writer, p *profile.Profile, title string) error {
	root := flameTree(p)
	depth := 0
	var measure func(n *flameNode, d int)
	measure = func(n *flameNode, d int) {
		if root.value == 0 || float64(n.value)/float64(root.value)*flameWidth < flameMinBox {
			return
		}
		depth = max(depth, d)
		for _, c := range n.children {
			measure(c, d+1)
		}
	}
	measure(root, 0)
	height := flameTop + float64(depth+1)*flameRow + 8
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="monospace" font-size="11">
<rect width="100%%" height="100%%" fill="#fbfbf7"/>
<text x="4" y="14" font-size="13">%s</text>
`, flameWidth, height, flameWidth, height, html.EscapeString(title))
	x := 4.0
	for _, k := range flameKinds {
		fmt.Fprintf(&b, `<rect x="%.0f" y="24" width="10" height="10" fill="%s"/><text x="%.0f" y="33">%s</text>
`, x, k.color, x+14, html.EscapeString(k.label))
		x += 14 + float64(len(k.label))*flameChar + 16
	}
	if root.value == 0 {
		b.WriteString(`<text x="4" y="60">no samples</text>
</svg>
`)
		_, err := io.WriteString(w, b.String())
		return err
	}
	scale := flameWidth / float64(root.value)
	var draw func(n *flameNode, x float64, d int)
	draw = func(n *flameNode, x float64, d int) {
		wd := float64(n.value) * scale
		if wd < flameMinBox {
			return
		}
		y := height - 8 - float64(d+1)*flameRow
		share := 100 * float64(n.value) / float64(root.value)
		fmt.Fprintf(&b, `<g><title>%s (%.2f%%)</title><rect x="%.2f" y="%.0f" width="%.2f" height="%.0f" fill="%s" stroke="#fbfbf7" stroke-width="0.5"/>`,
			html.EscapeString(n.name), share, x, y, wd, flameRow-1, flameShade(n.name))
		if fit := int((wd - 4) / flameChar); fit >= 3 {
			label := shortFrame(n.name)
			if len(label) > fit {
				label = label[:fit-2] + ".."
			}
			fmt.Fprintf(&b, `<text x="%.2f" y="%.0f">%s</text>`, x+2, y+flameRow-4, html.EscapeString(label))
		}
		b.WriteString("</g>\n")
		names := make([]string, 0, len(n.children))
		for name := range n.children {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			c := n.children[name]
			draw(c, x, d+1)
			x += float64(c.value) * scale
		}
	}
	draw(root, 0, 0)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// flameShade is the colour of name's kind, a little lighter or darker by
// a hash of the name so that neighbours of one kind stay apart.
func flameShade(name string) string {
	base := flameKinds[flameKind(name)].color
	var r, g, bl int
	fmt.Sscanf(base, "#%02x%02x%02x", &r, &g, &bl)
	h := fnv.New32a()
	h.Write([]byte(name))
	d := int(h.Sum32()%41) - 20
	c := func(v int) int { return min(255, max(0, v+d)) }
	return fmt.Sprintf("#%02x%02x%02x", c(r), c(g), c(bl))
}

// shortFrame drops a function name's import path, keeping its package:
// "github.com/bucketq/bucketq/txn.(*Runner).Run" is "txn.(*Runner).Run".
func shortFrame(name string) string {
	if i := strings.LastIndexByte(name, '/'); i >= 0 && i+1 < len(name) {
		return name[i+1:]
	}
	return name
}
