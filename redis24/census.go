package redis24

import (
	"sort"
	"strings"
	"sync"
)

// Census records which commands a program sent (or tried to send) and which
// violations were refused. It is safe for concurrent use; the zero value is
// ready to use.
type Census struct {
	mu         sync.Mutex
	counts     map[string]int
	violations []*Violation
}

// NewCensus returns an empty census.
func NewCensus() *Census { return &Census{} }

// Record counts one use of cmd (case-insensitive). Wrap calls it for every
// command, including the ones it refuses. The empty command is ignored.
func (c *Census) Record(cmd string) {
	if cmd == "" {
		return
	}
	name := strings.ToLower(cmd)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = make(map[string]int)
	}
	c.counts[name]++
}

// RecordViolation appends v to the violations. Wrap calls it for every
// refused command; other checkers (such as a hook in front of a test server) may too.
func (c *Census) RecordViolation(v *Violation) {
	if v == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violations = append(c.violations, v)
}

// Commands returns the distinct lowercase command names recorded, sorted.
func (c *Census) Commands() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.counts))
	for name := range c.counts {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Count returns how many times cmd (case-insensitive) was recorded.
func (c *Census) Count(cmd string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[strings.ToLower(cmd)]
}

// Violations returns the violations recorded so far, oldest first.
func (c *Census) Violations() []*Violation {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*Violation, len(c.violations))
	copy(out, c.violations)
	return out
}

// Outside24 returns the recorded command names that are not in the Redis 2.4
// table, sorted. Wrap refuses them, so this is empty unless something tried.
func (c *Census) Outside24() []string {
	var out []string
	for _, name := range c.Commands() {
		if !commandSet[name] {
			out = append(out, name)
		}
	}
	return out
}
