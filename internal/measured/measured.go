// Package measured lets long-running tests leave their figures where a
// renderer can turn them into a table of the docs, so that no figure in
// docs/ is copied by hand.
//
// A test calls Log with what it measured. Nothing happens unless the
// environment variable named by Env holds a file path; then one JSON
// object per call is appended to that file. The render command
// (go run ./internal/measured/render) aggregates such a file into the
// generated blocks of a Markdown page.
package measured

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// Env names the environment variable holding the file that Log appends to.
const Env = "BUCKETQ_MEASURE_LOG"

// Record is one line of the log.
type Record struct {
	// Kind groups records into one table (for example "failover").
	Kind string `json:"kind"`
	// Name is the row: a test name and what it did.
	Name string `json:"name"`
	// At is when the record was written.
	At time.Time `json:"at"`
	// Figures are the measured values, by column name.
	Figures map[string]float64 `json:"figures"`
	// Notes are free-form values (error kinds, say).
	Notes map[string]string `json:"notes,omitempty"`
}

var mu sync.Mutex

// Log appends a record to the file named by $BUCKETQ_MEASURE_LOG and
// reports whether it did. An unset variable is not an error.
func Log(kind, name string, figures map[string]float64, notes map[string]string) (bool, error) {
	path := os.Getenv(Env)
	if path == "" {
		return false, nil
	}
	b, err := json.Marshal(Record{Kind: kind, Name: name, At: time.Now().UTC(), Figures: figures, Notes: notes})
	if err != nil {
		return false, fmt.Errorf("measured: encode %s/%s: %w", kind, name, err)
	}
	mu.Lock()
	defer mu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return false, fmt.Errorf("measured: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return false, fmt.Errorf("measured: write %s: %w", path, err)
	}
	return true, f.Close()
}

// ReplaceBlock replaces what lies between <!-- BEGIN GENERATED name -->
// and <!-- END GENERATED name --> in page with body (kept on lines of its
// own), and reports whether page has that block.
func ReplaceBlock(page []byte, name, body string) ([]byte, bool) {
	begin := []byte("<!-- BEGIN GENERATED " + name + " -->")
	end := []byte("<!-- END GENERATED " + name + " -->")
	i := bytes.Index(page, begin)
	j := bytes.Index(page, end)
	if i < 0 || j < i {
		return page, false
	}
	var b bytes.Buffer
	b.Write(page[:i+len(begin)])
	b.WriteString("\n" + body)
	b.Write(page[j:])
	return b.Bytes(), true
}
