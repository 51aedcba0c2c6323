package buckets

import (
	"context"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// cmdCounter counts the commands sent on a connection, by name.
type cmdCounter struct {
	redis.Conn
	n map[string]int
}

func (c *cmdCounter) Send(name string, args ...interface{}) error {
	c.n[name]++
	return c.Conn.Send(name, args...)
}

func (c *cmdCounter) Do(name string, args ...interface{}) (interface{}, error) {
	if name != "" {
		c.n[name]++
	}
	return c.Conn.Do(name, args...)
}

func (c *cmdCounter) DoContext(ctx context.Context, name string, args ...interface{}) (interface{}, error) {
	if name != "" {
		c.n[name]++
	}
	return redis.DoContext(c.Conn, ctx, name, args...)
}

func (c *cmdCounter) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.Conn, ctx)
}

// TestClaimBatchTrimsInflightHead: a batch whose ids are the head of the
// in-flight list (as PopMany left them) leaves it with one LTRIM; one
// with another id pushed in front (popped since, not in the batch) takes
// each id out with LREM and leaves the other where it is.
func TestClaimBatchTrimsInflightHead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		extra bool
	}{{"at the head", false}, {"another id in front", true}} {
		t.Run(tc.name, func(t *testing.T) {
			st, pool, admin := realStore(t)
			ctx := testCtx(t)
			c := pool.Get()
			defer c.Close()
			if err := enqueued("old", "a", "b", "c", "x")(ctx, st, c); err != nil {
				t.Fatal(err)
			}
			if id, err := st.Pop(ctx, c, "q", w1); err != nil || id != "old" {
				t.Fatalf("pop: %q %v", id, err)
			}
			ids, err := st.PopMany(ctx, c, "q", w1, 3)
			if err != nil || len(ids) != 3 {
				t.Fatalf("pop many: %v %v", ids, err)
			}
			if tc.extra {
				if id, err := st.Pop(ctx, c, "q", w1); err != nil || id != "x" {
					t.Fatalf("pop: %q %v", id, err)
				}
			}
			cc := &cmdCounter{Conn: pool.Get(), n: map[string]int{}}
			defer cc.Close()
			_, res, err := st.ClaimBatch(ctx, cc, w1, "q", ids, t0+10, lease, make([]ClaimState, 3), false)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r != Claimed {
					t.Fatalf("%s: %v", ids[i], r)
				}
			}
			left, err := redis.Strings(admin.Do("LRANGE", st.Keys.Inflight(w1), 0, -1))
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"old"}
			if tc.extra {
				want = []string{"x", "old"}
			}
			if len(left) != len(want) || left[0] != want[0] || left[len(left)-1] != want[len(want)-1] {
				t.Fatalf("in-flight list %v, want %v", left, want)
			}
			trims, rems := cc.n["LTRIM"], cc.n["LREM"]
			if tc.extra && (trims != 0 || rems != 3) || !tc.extra && (trims != 1 || rems != 0) {
				t.Fatalf("LTRIM %d, LREM %d", trims, rems)
			}
		})
	}
}
