package buckets

import (
	"fmt"
	"testing"

	"github.com/gomodule/redigo/redis"
)

func wakeRec(id string, due, now int64) *Record {
	return &Record{ID: id, Queue: "wq", Type: "t", State: StateWaiting, MaxAttempts: 1, TimeoutMs: 1000, Created: now, Due: due}
}

// A bucket at most WakeHorizon ahead wakes the dispatchers; one further
// ahead is indexed and counted all the same, without a token (the
// dispatchers' periodic reads of the index find it).
func TestEnqueueWakesOnlyWithinHorizon(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	const now = int64(1_700_000_000_000)
	wakes := func() int {
		n, err := redis.Int(admin.Do("LLEN", st.Keys.Wake()))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i, c := range []struct {
		due   int64
		token bool
	}{
		{now + WakeHorizon + 2000, false},
		{now + 5000, true},
		{now + WakeHorizon - 1000, true},
	} {
		before := wakes()
		if err := st.Enqueue(ctx, conn, now, []*Record{wakeRec(fmt.Sprintf("w%d", i), c.due, now)}); err != nil {
			t.Fatal(err)
		}
		if got := wakes() - before; got != map[bool]int{false: 0, true: 1}[c.token] {
			t.Fatalf("due in %d ms: %d wake tokens pushed, want token=%v", c.due-now, got, c.token)
		}
		ts := BucketTime(c.due, st.Resolution)
		if _, err := redis.Int64(admin.Do("ZSCORE", st.Keys.Schedule(), Member("wq", ts))); err != nil {
			t.Fatalf("due in %d ms: bucket not indexed: %v", c.due-now, err)
		}
	}
	n, err := redis.Int(admin.Do("HGET", st.Keys.Stats("wq"), StatScheduled))
	if err != nil || n != 3 {
		t.Fatalf("scheduled gauge %d (%v), want 3", n, err)
	}
}

// Single tokens are trimmed one push in trimEvery: a notify list nobody
// pops never holds more than wakeTokens + trimEvery - 1 tokens from one
// Store.
func TestNotifyListBoundedWithSparseTrims(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	const now = int64(1_700_000_000_000)
	longest := 0
	for i := 0; i < 3*wakeTokens; i++ {
		if err := st.Enqueue(ctx, conn, now, []*Record{wakeRec(fmt.Sprintf("n%d", i), now, now)}); err != nil {
			t.Fatal(err)
		}
		n, err := redis.Int(admin.Do("LLEN", st.Keys.Notify("wq")))
		if err != nil {
			t.Fatal(err)
		}
		longest = max(longest, n)
	}
	if longest > wakeTokens+trimEvery-1 || longest < wakeTokens {
		t.Fatalf("notify list reached %d tokens; want %d to %d", longest, wakeTokens, wakeTokens+trimEvery-1)
	}
}
