package engine

import (
	"strings"
	"testing"
	"time"
)

// Stats with one queue's counters damaged returns the other queues'
// figures and an error naming the damaged one, instead of zeros and nil.
func TestStatsReportsDamagedQueue(t *testing.T) {
	t.Parallel()
	e := realEnv(t)
	c := e.client(t)
	ctx := checkCtx(t, 30*time.Second)
	for _, q := range []string{"good", "bad"} {
		if _, err := c.Enqueue(ctx, "t", nil, Queue(q), In(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	admin := e.admin(t)
	if _, err := admin.Do("DEL", e.key("st:bad")); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Do("SET", e.key("st:bad"), "x"); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stats(ctx)
	if err == nil || !strings.Contains(err.Error(), "queue bad") {
		t.Fatalf("Stats error = %v; want one naming queue bad", err)
	}
	var good *QueueInfo
	for i := range st {
		if st[i].Queue == "good" {
			good = &st[i]
		}
	}
	if len(st) != 2 || good == nil || good.Scheduled != 1 {
		t.Fatalf("Stats = %+v; want both queues, good with scheduled 1", st)
	}
}
