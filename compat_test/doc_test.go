package compat_test

import (
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/bucketq/bucketq/redis24"
)

// compatDocPath is docs/compat.md, from the package directory (go test runs
// there).
const compatDocPath = "../docs/compat.md"

// compatDoc is what the suite reads from docs/compat.md.
type compatDoc struct {
	text string
	// sends are the commands the engine sends in normal operation: the
	// suite must see each of them. errorPaths are sent only on failures
	// (and may be missing from a census).
	sends, errorPaths []string
	reasons           map[string]string
	sentBy            map[string]string // the "Sent by" cell of each command
}

func (d *compatDoc) lists(cmd string) bool {
	_, ok := d.reasons[strings.ToLower(cmd)]
	return ok
}

var docRow = regexp.MustCompile("^\\|\\s*`([A-Za-z]+)`\\s*\\|(.*)\\|\\s*$")

// readCompatDoc parses the command tables of docs/compat.md: rows like
// "| `BLPOP` | who sends it | why |" under the "## Commands the engine
// sends" heading, and under "## Commands sent only on error paths".
func readCompatDoc() (*compatDoc, error) {
	b, err := os.ReadFile(compatDocPath)
	if err != nil {
		return nil, fmt.Errorf("read the compatibility doc: %w", err)
	}
	d := &compatDoc{text: string(b), reasons: map[string]string{}, sentBy: map[string]string{}}
	var section *[]string
	for _, line := range strings.Split(d.text, "\n") {
		if strings.HasPrefix(line, "## ") {
			section = nil
			h := strings.ToLower(line)
			switch {
			case strings.Contains(h, "commands sent only on error paths"):
				section = &d.errorPaths
			case strings.Contains(h, "commands the engine sends"):
				section = &d.sends
			}
			continue
		}
		if section == nil {
			continue
		}
		m := docRow.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		name := strings.ToLower(m[1])
		if _, dup := d.reasons[name]; dup {
			return nil, fmt.Errorf("%s lists %s twice", compatDocPath, m[1])
		}
		cells := strings.Split(m[2], "|")
		d.reasons[name] = strings.TrimSpace(cells[len(cells)-1])
		if len(cells) > 1 {
			d.sentBy[name] = strings.TrimSpace(cells[0])
		}
		*section = append(*section, name)
	}
	if len(d.sends) == 0 {
		return nil, fmt.Errorf("%s has no table under \"## Commands the engine sends\"", compatDocPath)
	}
	return d, nil
}

// TestCompatDoc checks docs/compat.md on its own: every command it lists is
// in the Redis 2.4 table and comes with a reason, and its server matrix
// names the miniredis this suite is built with.
func TestCompatDoc(t *testing.T) {
	d, err := readCompatDoc()
	if err != nil {
		t.Fatal(err)
	}
	for name, why := range d.reasons {
		if !redis24.Allowed(name) {
			t.Errorf("docs/compat.md lists %s, which is not in the Redis 2.4 command table", strings.ToUpper(name))
		}
		if len(why) < 10 {
			t.Errorf("docs/compat.md gives no reason for %s", strings.ToUpper(name))
		}
	}
	for _, h := range []string{"## Server matrix", "## Redis 2.4 behaviours"} {
		if !strings.Contains(d.text, h) {
			t.Errorf("docs/compat.md has no %q section", h)
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/alicebob/miniredis/v2" && !strings.Contains(d.text, "miniredis "+m.Version) {
				t.Errorf("docs/compat.md's server matrix does not name miniredis %s, which the suite uses", m.Version)
			}
		}
	}
	t.Logf("docs/compat.md: %d commands sent, %d on error paths only", len(d.sends), len(d.errorPaths))
}

// TestCompatDocModes checks the table of commands each Redis mode adds in
// docs/compat.md against what the 2.4 guard lets through for each mode.
func TestCompatDocModes(t *testing.T) {
	b, err := os.ReadFile(compatDocPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	_, section, ok := strings.Cut(text, "## Commands each Redis mode adds")
	if !ok {
		t.Fatalf("docs/compat.md has no \"## Commands each Redis mode adds\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, mode := range []redis24.Mode{redis24.ModeCluster, redis24.ModeSentinel} {
		for _, c := range redis24.ModeCommands(mode) {
			row := "| " + string(mode) + " | `" + c
			if !strings.Contains(strings.ToLower(section), strings.ToLower(row)) {
				t.Errorf("docs/compat.md's mode table has no row for %s in mode %s (want a line starting %q)", c, mode, row)
			}
		}
	}
}
