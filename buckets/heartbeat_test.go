package buckets

import (
	"testing"

	"github.com/gomodule/redigo/redis"
)

// Refresh renews the heartbeat and the served-type keys and nothing else:
// the registry and the unserved hash are Beat's.
func TestRefreshRenewsOnly(t *testing.T) {
	t.Parallel()
	st, pool, admin := realStore(t)
	ctx := testCtx(t)
	conn := pool.Get()
	defer conn.Close()
	if _, err := admin.Do("HSET", st.Keys.Unserved("q"), "t", 1); err != nil {
		t.Fatal(err)
	}
	if err := st.Refresh(ctx, conn, "w1", 30, []byte("info"), Served{Queue: "q", Types: []string{"t"}, TTL: 30}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{st.Keys.Heartbeat("w1"), st.Keys.Served("q", "t")} {
		if ttl, err := redis.Int(admin.Do("TTL", k)); err != nil || ttl <= 0 || ttl > 30 {
			t.Errorf("TTL %s = %d, %v; want a TTL of at most 30 s", k, ttl, err)
		}
	}
	if n, err := redis.Int(admin.Do("EXISTS", st.Keys.Workers())); err != nil || n != 0 {
		t.Errorf("Refresh registered the worker (%d, %v)", n, err)
	}
	if ok, err := redis.Bool(admin.Do("HEXISTS", st.Keys.Unserved("q"), "t")); err != nil || !ok {
		t.Errorf("Refresh cleared the unserved type (%v, %v)", ok, err)
	}
	// A full beat does both.
	if err := st.Beat(ctx, conn, "w1", 30, []byte("info"), Served{Queue: "q", Types: []string{"t"}, TTL: 30}); err != nil {
		t.Fatal(err)
	}
	if ok, err := redis.Bool(admin.Do("SISMEMBER", st.Keys.Workers(), "w1")); err != nil || !ok {
		t.Errorf("Beat did not register the worker (%v, %v)", ok, err)
	}
	if ok, err := redis.Bool(admin.Do("HEXISTS", st.Keys.Unserved("q"), "t")); err != nil || ok {
		t.Errorf("Beat left the unserved type (%v, %v)", ok, err)
	}
	// Without types: the heartbeat alone.
	if err := st.Refresh(ctx, conn, "w2", 30, []byte("info")); err != nil {
		t.Fatal(err)
	}
	if ttl, err := redis.Int(admin.Do("TTL", st.Keys.Heartbeat("w2"))); err != nil || ttl <= 0 {
		t.Errorf("TTL of w2's heartbeat = %d, %v", ttl, err)
	}
}
