package compat_test

import (
	"os"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

// senders records, for each command, the engine functions on the call
// stack when it was sent: the "Sent by" column of docs/compat.md is
// checked against them.
type senders struct {
	mu sync.Mutex
	// names: command -> every function name seen on its stacks.
	names map[string]map[string]bool
	// stacks: command -> distinct sets of names (joined) -> the set.
	stacks map[string]map[string][]string
}

const modulePrefix = "github.com/bucketq/bucketq/"

// closurePart matches what the compiler appends to a function's name for
// closures and wrappers: func1, gowrap2, 1.
var typeParams = regexp.MustCompile(`\[[^\]]*\]`)

var closurePart = regexp.MustCompile(`^(func|gowrap|deferwrap)?[0-9]+$`)

// frameName splits a frame's function into its package (last path
// element) and its name without receiver, closure suffixes or type
// parameters: ".../buckets.(*Store).Claim.func1" is "buckets", "Claim".
func frameName(function string) (pkg, name string) {
	rest := typeParams.ReplaceAllString(function[strings.LastIndex(function, "/")+1:], "")
	parts := strings.Split(rest, ".")
	pkg = parts[0]
	parts = parts[1:]
	for len(parts) > 0 && closurePart.MatchString(parts[len(parts)-1]) {
		parts = parts[:len(parts)-1]
	}
	if len(parts) == 0 {
		return pkg, ""
	}
	return pkg, parts[len(parts)-1]
}

// engineFrames is the set of names on the current stack from the engine's
// packages: each function's name, and "txn" for a frame of package txn.
func engineFrames() []string {
	var pcs [64]uintptr
	n := runtime.Callers(3, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	set := map[string]bool{}
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, modulePrefix) {
			path := strings.TrimPrefix(f.Function, modulePrefix)
			switch {
			case strings.HasPrefix(path, "buckets."), strings.HasPrefix(path, "engine."), strings.HasPrefix(path, "engine/internal/"), strings.HasPrefix(path, "txn."):
				pkg, name := frameName(f.Function)
				if name != "" {
					set[name] = true
				}
				if pkg == "txn" {
					set["txn"] = true
				}
			}
		}
		if !more {
			break
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (s *senders) record(command string) {
	names := engineFrames()
	if len(names) == 0 {
		return // not sent by the engine (test setup, the pool's DISCARD)
	}
	cmd := strings.ToLower(command)
	key := strings.Join(names, " ")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.names == nil {
		s.names, s.stacks = map[string]map[string]bool{}, map[string]map[string][]string{}
	}
	if s.names[cmd] == nil {
		s.names[cmd], s.stacks[cmd] = map[string]bool{}, map[string][]string{}
	}
	for _, n := range names {
		s.names[cmd][n] = true
	}
	s.stacks[cmd][key] = names
}

// backticked is every `identifier` in a table cell.
var backticked = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*)`")

// checkSenders checks the "Sent by" column of the doc's table of commands
// the engine sends against what the suite saw: every function the column
// names (in backticks) must have been on the stack of that command (when
// the whole list ran, so that every sender had its chance), and every
// stack that sent it must hold a function the column names.
func checkSenders(t *testing.T, s *senders, doc *compatDoc, full bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cmd := range doc.sends {
		if os.Getenv("COMPAT_DUMP_SENDERS") != "" {
			for k := range s.stacks[cmd] {
				t.Logf("SENDER %s: %s", cmd, k)
			}
		}
		// Items are separated by commas; "`A` or `B`" in one item names
		// senders that race for the same work (one run may see either).
		named := map[string]bool{}
		var items [][]string
		for _, item := range strings.Split(doc.sentBy[cmd], ",") {
			var alts []string
			for _, m := range backticked.FindAllStringSubmatch(item, -1) {
				named[m[1]] = true
				alts = append(alts, m[1])
			}
			if len(alts) > 0 {
				items = append(items, alts)
			}
		}
		if len(named) == 0 {
			t.Errorf("docs/compat.md: the \"Sent by\" cell of %s names no function in backticks", strings.ToUpper(cmd))
			continue
		}
		if full {
			for _, alts := range items {
				if !slices.ContainsFunc(alts, func(n string) bool { return s.names[cmd][n] }) {
					t.Errorf("docs/compat.md says %s sends %s, but none was on the stack of one", strings.Join(alts, " or "), strings.ToUpper(cmd))
				}
			}
		}
		keys := make([]string, 0, len(s.stacks[cmd]))
		for k := range s.stacks[cmd] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !slices.ContainsFunc(s.stacks[cmd][k], func(n string) bool { return named[n] }) {
				t.Errorf("%s was sent by a caller docs/compat.md's \"Sent by\" cell does not name (stack functions: %s)", strings.ToUpper(cmd), k)
			}
		}
	}
}

func TestFrameName(t *testing.T) {
	for in, want := range map[string][2]string{
		modulePrefix + "buckets.(*Store).Claim.func1":               {"buckets", "Claim"},
		modulePrefix + "engine.(*Worker).waiter":                    {"engine", "waiter"},
		modulePrefix + "engine.blockPop":                            {"engine", "blockPop"},
		modulePrefix + "engine/internal/rconn.(*Blocker).Pop.func1": {"rconn", "Pop"},
		modulePrefix + "buckets.sortedKeys[...]":                    {"buckets", "sortedKeys"},
		modulePrefix + "txn.(*Runner).Run.gowrap1":                  {"txn", "Run"},
		modulePrefix + "engine.(*Dispatcher).run.func2.1":           {"engine", "run"},
	} {
		if pkg, name := frameName(in); pkg != want[0] || name != want[1] {
			t.Errorf("frameName(%s) = %s, %s; want %s, %s", in, pkg, name, want[0], want[1])
		}
	}
}
