package topology_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bucketq/bucketq/internal/measured"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/bucketq/bucketq/redis24"
	"github.com/bucketq/bucketq/topology"
	"github.com/gomodule/redigo/redis"
)

func controlDial(t *testing.T, mode redis24.Mode) topology.Dialer {
	return func(ctx context.Context, addr string) (redis.Conn, error) {
		conn, err := redis.DialContext(ctx, "tcp", addr, redis.DialConnectTimeout(time.Second),
			redis.DialReadTimeout(5*time.Second), redis.DialWriteTimeout(5*time.Second))
		if err != nil {
			return nil, err
		}
		var opts []redis24.Option
		if mode != "" {
			opts = append(opts, redis24.ForMode(mode))
		}
		opts = append(opts, redis24.OnViolation(func(v *redis24.Violation) {
			t.Errorf("control connection (mode %q) sent a command outside its set: %v", mode, v)
		}))
		return redis24.Wrap(conn, opts...), nil
	}
}

// TestSentinelFailover runs an engine on a master watched by three
// sentinels, through the Sentinel pool; the master is killed, the
// sentinels promote the replica, and the engine must follow it and carry
// on. Acknowledged tasks lost with the master's unreplicated writes are
// counted and reported.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	census := redis24.NewCensus()
	ts, err := topology.NewSentinel(topology.SentinelOptions{
		Sentinels:    s.SentinelAddrs(),
		MasterName:   s.Name,
		Dial:         guardedDial(t, census),
		DialControl:  controlDial(t, redis24.ModeSentinel),
		DialSentinel: controlDial(t, redis24.ModeSentinel),
		Pool:         topology.PoolOptions{MaxBackoff: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if addr, err := ts.Master(ctx); err != nil || addr != s.Master.Addr {
		t.Fatalf("Master = %q, %v; want %s", addr, err, s.Master.Addr)
	}

	ns := fmt.Sprintf("sentinel%d", time.Now().UnixNano()%1e6)
	l := startLoad(t, ts.Pool(), ns, 4)
	l.waitAcked(50, 20*time.Second)
	l.keep(loadAcks, 1)
	atKill := l.ackedCount()
	killed := time.Now()
	s.Master.Kill(t)
	t.Logf("killed master %s after %d acknowledged enqueues", s.Master.Addr, atKill)
	s.WaitMaster(t, s.Replica.Addr, 60*time.Second)
	l.waitAcked(100, 60*time.Second)
	if addr, err := ts.Master(ctx); err != nil || addr != s.Replica.Addr {
		t.Errorf("after the failover Master = %q, %v; want the promoted replica %s", addr, err, s.Replica.Addr)
	}
	l.keep(loadAcks/2, 0.5)
	lost, dups := l.settle(8 * time.Second)
	l.report("sentinel failover", lost, dups, killed)
	t.Logf("master switches followed: %d", ts.Switches())
	if ts.Switches() < 1 {
		t.Errorf("the pool did not switch to the new master")
	}
	if len(lost) > atKill {
		t.Errorf("%d acknowledged tasks lost, more than the %d acknowledged before the kill", len(lost), atKill)
	}
	l.stopServer()
	if out := census.Outside24(); len(out) > 0 {
		t.Errorf("the engine's connections sent commands outside Redis 2.4: %v", out)
	}
}

// TestSentinelReplicaPromotion24 is the Redis 2.4 way without Sentinel: the
// configured server is a replica, so the Replicated pool refuses to write
// (a 2.4 replica would accept the writes and lose them at its next resync);
// after an operator's SLAVEOF NO ONE on it, writes resume within seconds.
// Only 2.4 commands reach the servers, INFO (no argument) included.
func TestSentinelReplicaPromotion24(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t, redistest.Private())
	replica := redistest.Start(t, redistest.Private())
	admin := replica.Admin(t)
	host, port := splitAddr(t, primary.Addr)
	if _, err := admin.Do("SLAVEOF", host, port); err != nil {
		t.Fatal(err)
	}
	census := redis24.NewCensus()
	tr, err := topology.NewReplicated(topology.ReplicatedOptions{
		Servers: []string{replica.Addr},
		Dial: func(ctx context.Context, addr string) (redis.Conn, error) {
			return guardedDial(t, census)(ctx, addr)
		},
		DialControl: controlDial(t, ""),
		Pool:        topology.PoolOptions{MaxBackoff: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ns := fmt.Sprintf("promote%d", time.Now().UnixNano()%1e6)
	l := startLoad(t, tr.Pool(), ns, 2)

	// Refused while the configured server is a replica, with a clear error.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err = l.client.Enqueue(ctx, "job", nil)
	cancel()
	if !errors.Is(err, topology.ErrNotMaster) {
		t.Fatalf("Enqueue on a replica = %v, want an error wrapping topology.ErrNotMaster", err)
	}
	t.Logf("refused while %s is a replica: %v", replica.Addr, err)
	if n := dbsize(t, admin); n != 0 {
		t.Fatalf("the replica holds %d keys: something was written to it", n)
	}
	if l.ackedCount() != 0 {
		t.Fatalf("%d enqueues acknowledged by a replica", l.ackedCount())
	}

	promoted := time.Now()
	if _, err := admin.Do("SLAVEOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
	l.waitAcked(20, 20*time.Second)
	t.Logf("writes resumed %v after SLAVEOF NO ONE", time.Since(promoted).Round(time.Millisecond))
	lost, dups := l.settle(20 * time.Second)
	l.report("2.4 promotion", lost, dups, time.Time{})
	if len(lost) > 0 {
		t.Errorf("%d acknowledged tasks never ran: %v", len(lost), lost[:min(10, len(lost))])
	}
	l.stopServer()
	redistest.RequireNoViolations(t, replica)
	if out := census.Outside24(); len(out) > 0 {
		t.Errorf("the engine's connections sent commands outside Redis 2.4: %v", out)
	}
}

// TestSentinelReplicatedRefusesTwoMasters lists two servers that both say
// role:master: nothing is written until one is made a replica.
func TestSentinelReplicatedRefusesTwoMasters(t *testing.T) {
	t.Parallel()
	a := redistest.Start(t, redistest.Private())
	b := redistest.Start(t, redistest.Private())
	tr, err := topology.NewReplicated(topology.ReplicatedOptions{Servers: []string{a.Addr, b.Addr}, RoleMaxAge: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := tr.Master(ctx); !errors.Is(err, topology.ErrSeveralMasters) {
		t.Fatalf("Master with two masters listed = %v, want ErrSeveralMasters", err)
	}
	host, port := splitAddr(t, a.Addr)
	if _, err := b.Admin(t).Do("SLAVEOF", host, port); err != nil {
		t.Fatal(err)
	}
	// Once RoleMaxAge passed, the roles read before are stale: read again.
	var addr string
	testwait.Until(t, 10*time.Second, "Master to read the roles again", func() bool {
		addr, err = tr.Master(ctx)
		return err == nil
	})
	if addr != a.Addr {
		t.Fatalf("Master after SLAVEOF on %s = %q; want %s", b.Addr, addr, a.Addr)
	}
}

// TestSentinelReplicatedFailover24 is a Redis 2.4 failover by hand: the
// primary and its replica are listed; while producers and workers run, the
// primary is killed; nothing is written while the replica is still a
// replica; after an operator's SLAVEOF NO ONE on it the engine carries on
// there. Acknowledged tasks lost with the primary's unreplicated writes
// are counted and reported.
func TestSentinelReplicatedFailover24(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t, redistest.WithAppendOnly())
	replica := redistest.Start(t, redistest.WithAppendOnly())
	admin := replica.Admin(t)
	host, port := splitAddr(t, primary.Addr)
	if _, err := admin.Do("SLAVEOF", host, port); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, outcomeWait, "the replica to sync", func() bool {
		info, err := redis.String(admin.Do("INFO"))
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	census := redis24.NewCensus()
	tr, err := topology.NewReplicated(topology.ReplicatedOptions{
		Servers:     []string{primary.Addr, replica.Addr},
		Dial:        guardedDial(t, census),
		DialControl: controlDial(t, ""),
		Pool:        topology.PoolOptions{MaxBackoff: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ns := fmt.Sprintf("fail24%d", time.Now().UnixNano()%1e6)
	l := startLoad(t, tr.Pool(), ns, 4)
	l.waitAcked(50, 20*time.Second)
	l.keep(loadAcks, 1)
	killed := time.Now()
	primary.Kill(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	testwait.Until(t, outcomeWait, "the pool to refuse the replica", func() bool {
		_, err := tr.Master(ctx)
		return errors.Is(err, topology.ErrNotMaster)
	})
	atPromotion := l.ackedCount()
	if _, err := admin.Do("SLAVEOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	l.waitAcked(1, 20*time.Second)
	resumed := time.Since(promoted)
	t.Logf("writes resumed on %s %v after SLAVEOF NO ONE (%d acknowledged before it)", replica.Addr,
		resumed.Round(time.Millisecond), atPromotion)
	if _, err := measured.Log("promotion", "`"+t.Name()+"`", map[string]float64{
		"resumed_ms": float64(resumed.Milliseconds()),
	}, nil); err != nil {
		t.Error(err)
	}
	l.waitAcked(50, 20*time.Second)
	l.keep(loadAcks/2, 0.5)
	lost, dups := l.settle(8 * time.Second)
	l.report("2.4 failover", lost, dups, killed)
	if len(lost) > atPromotion {
		t.Errorf("%d acknowledged tasks lost, more than the %d acknowledged before the promotion", len(lost), atPromotion)
	}
	l.stopServer()
	if out := census.Outside24(); len(out) > 0 {
		t.Errorf("the engine's connections sent commands outside Redis 2.4: %v", out)
	}
}

// outcomeWait bounds a wait for an outcome (runs done, a task moved, a
// server promoted) whose time is the machine's, not the engine's: a
// loaded machine runs tasks tens of times slower than an idle one, so it
// is generous and only decides how long a failure takes to report. A
// bound the test asserts (a wake-up before IdleWait) is checked on its
// own.
const outcomeWait = 3 * time.Minute
