package enginetest

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/enginehook"
)

// Match picks enqueued tasks: a task matches when it matches every field
// that is set; the zero Match matches every task.
type Match struct {
	Type  string
	Queue string
	// Payload, when not nil, must equal the payload; PayloadFunc, when
	// not nil, must accept it.
	Payload     []byte
	PayloadFunc func(payload []byte) bool
	// Due, when not zero, must be within DueWithin of the due time (0:
	// the same millisecond).
	Due       time.Time
	DueWithin time.Duration
	// MaxAttempts, Timeout and Priority, when not zero, must equal the
	// task's.
	MaxAttempts int
	Timeout     time.Duration
	Priority    int
	// UniqueKey, when set, must be the key of engine.UniqueKey.
	UniqueKey string
	// Key, when set, must be the task's flow-control key (engine.Key).
	// A keyed task is found only with it: a key's ready and scheduled
	// tasks wait in lists of their own (engine.Filter.Key).
	Key string
	// Metadata's pairs must all be in the task's metadata.
	Metadata map[string]string
}

// String describes the fields of m that are set.
func (m Match) String() string {
	var parts []string
	add := func(format string, a ...any) { parts = append(parts, fmt.Sprintf(format, a...)) }
	if m.Type != "" {
		add("type=%q", m.Type)
	}
	if m.Queue != "" {
		add("queue=%q", m.Queue)
	}
	if m.Payload != nil {
		add("payload=%q", m.Payload)
	}
	if m.PayloadFunc != nil {
		add("payload=func")
	}
	if !m.Due.IsZero() {
		add("due=%s±%v", m.Due.Format(time.RFC3339Nano), m.DueWithin)
	}
	if m.MaxAttempts != 0 {
		add("max_attempts=%d", m.MaxAttempts)
	}
	if m.Timeout != 0 {
		add("timeout=%v", m.Timeout)
	}
	if m.Priority != 0 {
		add("priority=%d", m.Priority)
	}
	if m.UniqueKey != "" {
		add("unique_key=%q", m.UniqueKey)
	}
	if m.Key != "" {
		add("key=%q", m.Key)
	}
	keys := make([]string, 0, len(m.Metadata))
	for k := range m.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		add("metadata[%q]=%q", k, m.Metadata[k])
	}
	if len(parts) == 0 {
		return "any task"
	}
	return strings.Join(parts, " ")
}

// matches reports whether ti matches m, the unique key aside.
func (m Match) matches(ti *engine.TaskInfo) bool {
	switch {
	case m.Type != "" && ti.Type != m.Type,
		m.Queue != "" && ti.Queue != m.Queue,
		m.Payload != nil && !bytes.Equal(ti.Payload, m.Payload),
		m.PayloadFunc != nil && !m.PayloadFunc(ti.Payload),
		m.MaxAttempts != 0 && ti.MaxAttempts != m.MaxAttempts,
		m.Timeout != 0 && ti.Timeout != m.Timeout,
		m.Priority != 0 && ti.Priority != m.Priority,
		m.Key != "" && ti.Key != m.Key:
		return false
	}
	if !m.Due.IsZero() {
		// Due times are kept in whole milliseconds, rounded up.
		want := m.Due.Truncate(time.Millisecond)
		if want.Before(m.Due) {
			want = want.Add(time.Millisecond)
		}
		d := ti.Due.Sub(want)
		if d < 0 {
			d = -d
		}
		if d > m.DueWithin {
			return false
		}
	}
	for k, v := range m.Metadata {
		if got, ok := ti.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// waitingStates are the states of a task enqueued that has not run to
// its end.
var waitingStates = []engine.State{engine.StateReady, engine.StateScheduled, engine.StateRetrying}

// maxPages bounds the pages Enqueued reads of one state of one queue.
const maxPages = 10000

// Enqueued returns the waiting tasks (ready, scheduled or retrying) that
// match m, by due time, then id.
func (e *Env) Enqueued(ctx context.Context, m Match) ([]*engine.TaskInfo, error) {
	var queues []string
	if m.Queue != "" {
		queues = []string{m.Queue}
	} else {
		qs, err := e.in.Queues(ctx)
		if err != nil {
			return nil, fmt.Errorf("enginetest: list the queues: %w", err)
		}
		for _, q := range qs {
			queues = append(queues, q.Queue)
		}
	}
	var out []*engine.TaskInfo
	for _, q := range queues {
		for _, st := range waitingStates {
			opts := engine.ListOptions{Filter: engine.Filter{Queue: q, State: st, Key: m.Key}, Limit: 1000}
			for page := 0; ; page++ {
				if page == maxPages {
					return nil, fmt.Errorf("enginetest: %s tasks of queue %q: more than %d pages", st, q, maxPages)
				}
				p, err := e.in.ListTasks(ctx, opts)
				if err != nil {
					return nil, fmt.Errorf("enginetest: list the %s tasks of queue %q: %w", st, q, err)
				}
				for _, ti := range p.Tasks {
					ok, err := e.uniqueMatches(ctx, m, ti)
					if err != nil {
						return nil, err
					}
					if ok && m.matches(ti) {
						out = append(out, ti)
					}
				}
				if p.Next == "" {
					break
				}
				opts.Cursor = p.Next
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Due.Equal(out[j].Due) {
			return out[i].Due.Before(out[j].Due)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// uniqueMatches reports whether ti holds m's unique key (true when m
// names none).
func (e *Env) uniqueMatches(ctx context.Context, m Match, ti *engine.TaskInfo) (bool, error) {
	if m.UniqueKey == "" {
		return true, nil
	}
	k, err := enginehook.UniqueKey(ctx, e.pool, e.cfg, ti.ID)
	if err != nil {
		return false, fmt.Errorf("enginetest: unique key of task %s: %w", ti.ID, err)
	}
	return k == "k:"+m.UniqueKey, nil
}

// maxListed bounds the tasks a failure message lists.
const maxListed = 20

// RequireEnqueued returns the waiting tasks that match m, and fails t
// when there is none, listing the tasks that are waiting.
func (e *Env) RequireEnqueued(ctx context.Context, t testing.TB, m Match) []*engine.TaskInfo {
	t.Helper()
	got, err := e.Enqueued(ctx, m)
	if err != nil {
		t.Fatalf("enginetest: RequireEnqueued(%v): %v", m, err)
		return nil
	}
	if len(got) > 0 {
		return got
	}
	all, err := e.Enqueued(ctx, Match{})
	if err != nil {
		t.Fatalf("enginetest: no enqueued task matches %v (and the waiting tasks could not be listed: %v)", m, err)
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "enginetest: no enqueued task matches %v; %d waiting", m, len(all))
	for i, ti := range all {
		if i == maxListed {
			fmt.Fprintf(&b, "\n  ... and %d more", len(all)-maxListed)
			break
		}
		b.WriteString("\n  ")
		b.WriteString(describe(ti))
	}
	t.Fatalf("%s", b.String())
	return nil
}
