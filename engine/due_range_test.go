package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestDueRange: a due time the store cannot hold and read back (before
// 1970-01-01T00:00:00.001Z or after 9999-12-31T23:59:59.999Z) is refused
// with ErrInvalid and writes nothing; one at either end of the range
// is written and reads back the same through Lookup, the listings and
// Check. A due time in the past within the range still means now.
func TestDueRange(t *testing.T) {
	t.Parallel()
	eachServer(t, testDueRange)
}

func testDueRange(t *testing.T, e *env) {
	ctx := context.Background()
	c := e.client(t)
	bad := map[string]time.Time{
		"1<<62 s":          time.Unix(1<<62, 0),
		"year 300000":      time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC),
		"year 10000":       time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		"after the last":   time.Date(9999, 12, 31, 23, 59, 59, 999_000_001, time.UTC),
		"year 0":           time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		"1900":             time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC),
		"the Unix epoch":   time.Unix(0, 0),
		"before the epoch": time.Unix(0, -1),
	}
	for name, at := range bad {
		if _, err := c.Enqueue(ctx, "t", nil, At(at)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "9999-12-31") {
			t.Errorf("Enqueue with At(%s): %v, want ErrInvalid naming the range", name, err)
		}
		if _, err := c.EnqueueBatch(ctx, []NewTask{{Type: "t", Options: []Option{At(at)}}}); !errors.Is(err, ErrInvalid) {
			t.Errorf("EnqueueBatch with At(%s): %v, want ErrInvalid", name, err)
		}
	}
	if keys := e.keys(t); len(keys) != 0 {
		t.Fatalf("refused due times wrote keys: %v", keys)
	}

	last := time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC)
	first := time.UnixMilli(1)
	past := time.Date(2020, 3, 4, 5, 6, 7, 0, time.UTC)
	want := map[string]time.Time{}
	for _, at := range []time.Time{last, first, past} {
		info, err := c.Enqueue(ctx, "t", nil, At(at))
		if err != nil {
			t.Fatalf("Enqueue with At(%v): %v", at, err)
		}
		want[info.ID] = at
		got, err := c.Lookup(ctx, info.ID)
		if err != nil || !got.Due.Equal(at) {
			t.Fatalf("Lookup after Enqueue with At(%v) = %+v, %v; want that due time", at, got, err)
		}
		if at.Equal(last) != (got.State == StateScheduled) {
			t.Errorf("Enqueue with At(%v): state %v; want scheduled only for the future one", at, got.State)
		}
	}
	seen := 0
	for _, st := range []State{StateScheduled, StateReady} {
		p, err := c.inspector().ListTasks(ctx, ListOptions{Filter: Filter{Queue: "default", State: st}})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range p.Tasks {
			if at, ok := want[v.ID]; ok {
				seen++
				if !v.Due.Equal(at) {
					t.Errorf("listing of %s: due %v, want %v", v.ID, v.Due, at)
				}
			}
		}
	}
	if seen != len(want) {
		t.Errorf("the listings show %d of the %d tasks", seen, len(want))
	}
	rep, err := c.Check(ctx, CheckOptions{})
	if err != nil || len(rep.Findings)+len(rep.Unconfirmed) != 0 {
		t.Errorf("Check = %+v, %v; want nothing found", rep, err)
	}
}
