package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/redistest"
)

// A search over large records under MaxBytes reads about that much a
// page (at most one batch more), and paging on finds every match once:
// scheduled and ready tasks of 64 KiB, one matching in four.
func TestListTasksByteBudget(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	e := newEnv(t, srv)
	c := e.client(t)
	ctx := checkCtx(t, time.Minute)
	const n, size = 80, 64 << 10
	var batch []NewTask
	want := 0
	for i := range n {
		mark := "plain"
		if i%4 == 3 {
			mark, want = "zzzz", want+1
		}
		p := []byte(fmt.Sprintf("%s %d %s", mark, i, strings.Repeat("x", size)))
		batch = append(batch, NewTask{Type: "t", Payload: p},
			NewTask{Type: "t", Payload: p, Options: []Option{In(time.Hour + time.Duration(i)*time.Millisecond)}})
	}
	// In batches under the one write-size rule (MaxWriteBytes).
	for len(batch) > 0 {
		k := min(len(batch), 32)
		if _, err := c.EnqueueBatch(ctx, batch[:k]); err != nil {
			t.Fatal(err)
		}
		batch = batch[k:]
	}
	in := c.inspector()
	const budget = 256 << 10
	for _, st := range []State{StateScheduled, StateReady} {
		opts := ListOptions{Filter: Filter{Queue: "default", State: st, Search: "zzzz"}, Limit: 25, MaxBytes: budget}
		seen := map[string]bool{}
		pages := 0
		for {
			p, err := in.ListTasks(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if p.BytesRead > budget+judgeBatch*(size+1024) {
				t.Errorf("%s: a page read %d bytes, over the budget %d and one batch", st, p.BytesRead, budget)
			}
			for _, v := range p.Tasks {
				if seen[v.ID] {
					t.Errorf("%s: %s listed twice", st, v.ID)
				}
				seen[v.ID] = true
			}
			if p.Next == "" {
				break
			}
			opts.Cursor = p.Next
		}
		if len(seen) != want || pages < 2 {
			t.Errorf("%s: %d matches in %d pages, want %d over several pages", st, len(seen), pages, want)
		}
		// Without a budget one page reads every record.
		p, err := in.ListTasks(ctx, ListOptions{Filter: opts.Filter, Limit: 25})
		if err != nil {
			t.Fatal(err)
		}
		if p.BytesRead < n*size {
			t.Errorf("%s: without a budget a page read %d bytes, want every record (%d)", st, p.BytesRead, n*size)
		}
	}
	redistest.RequireNoViolations(t, srv)
}
