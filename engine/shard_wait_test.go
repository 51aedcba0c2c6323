package engine

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/topology"
	"github.com/gomodule/redigo/redis"
)

// blockedPops counts the server's clients blocked in BLPOP.
func blockedPops(t testing.TB, a redis.Conn) int {
	t.Helper()
	list, err := redis.String(a.Do("CLIENT", "LIST"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "cmd=blpop") && strings.Contains(line, "flags=b") {
			n++
		}
	}
	return n
}

// blockingKeys is a copy of the keys of h's BLPOP under way (nil: none).
func blockingKeys(h *waitHub) map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.blocking)
}

// TestShardSharedWait: the idle workers of four lanes on one server (one
// pool) block in one BLPOP, not four, and a task enqueued to any lane
// still wakes its worker, long before the idle wait would.
func TestShardSharedWait(t *testing.T) {
	t.Parallel()
	e := privateEnv(t)
	e.cfg.Advanced.IdleWait = 60 * time.Second // a lost wake-up would show as a minute's wait
	const n = 4
	sh := e.sameServer(n)
	a := e.admin(t)

	var mu sync.Mutex
	ran := map[string]bool{}
	mux := NewMux()
	mux.HandleFunc("job", func(_ context.Context, tk *Task) error {
		mu.Lock()
		ran[tk.ID] = true
		mu.Unlock()
		return nil
	})
	srv, err := newShardedServer(sh, e.cfg, mux, RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	waitFor(t, outcomeWait, "the lanes' workers to block in one BLPOP", func() bool { return blockedPops(t, a) == 1 })

	c := e.shardedClient(t, sh)
	ctx := context.Background()
	for round := range 3 {
		var ids []string
		for k := range n {
			ti, err := c.Enqueue(ctx, "job", nil, TaskID(idInLane("w"+string(rune('a'+round)), k, n)))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, ti.ID)
		}
		waitFor(t, outcomeWait, "every lane's task to wake its worker", func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				if !ran[id] {
					return false
				}
			}
			return true
		})
		waitFor(t, outcomeWait, "the workers to block in one BLPOP again", func() bool { return blockedPops(t, a) == 1 })
	}
	redistest.RequireNoViolations(t, e.srv)
}

// commandCalls reads the server's call count of each command from INFO
// commandstats.
func commandCalls(t testing.TB, a redis.Conn) map[string]int64 {
	t.Helper()
	info, err := redis.String(a.Do("INFO", "commandstats"))
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("commandstats %q: %v", line, err)
				}
				calls[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return calls
}

// lookCounter counts a dispatcher's looks at its lane (NextDue, the last
// read of a round that found nothing due).
type lookCounter struct {
	mover
	n atomic.Int64
}

func (l *lookCounter) NextDue(ctx context.Context, conn redis.Conn) (int64, bool, error) {
	l.n.Add(1)
	return l.mover.NextDue(ctx, conn)
}

// TestShardSharedWaitIdle: a process serving six lanes of one server,
// dispatchers and workers, blocks in one BLPOP while idle (twelve parts
// that would each block on a connection of their own), and its idle
// waits cost one BLPOP per IdleWait for the whole server: over several
// idle waits, in which every lane's dispatcher looked at its lane after
// each (as its own idle wait would make it), the server saw one BLPOP per
// idle wait, not one per lane and part, and no LPUSH (a waiting part that
// waits again finds its lists in the BLPOP under way).
func TestShardSharedWaitIdle(t *testing.T) {
	t.Parallel()
	e := privateEnv(t)
	e.cfg.Advanced.HeartbeatInterval = time.Second
	e.cfg.Advanced.HeartbeatTTL = 3 * time.Second
	const n = 6
	sh := e.sameServer(n)
	a := e.admin(t)
	srv, err := newShardedServer(sh, e.cfg, HandlerFunc(func(context.Context, *Task) error { return nil }), RoleDispatcher|RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	looks := make([]*lookCounter, n)
	for k, l := range srv.lanes {
		looks[k] = &lookCounter{mover: l.Dispatcher.moves}
		l.Dispatcher.moves = looks[k]
	}
	runBackground(t, srv.Run)
	waitFor(t, outcomeWait, "the lanes' dispatchers and workers to block in one BLPOP", func() bool { return blockedPops(t, a) == 1 })
	// Every lane's worker past its start: waiting in the shared BLPOP. A
	// worker that starts later, on a loaded machine, rightly ends the
	// BLPOP under way (an LPUSH) to have its lists named: that is not the
	// idle cost measured here.
	hub := srv.lanes[0].Worker.cfg.lane.hub
	var workerKeys []string
	for _, l := range srv.lanes {
		if l.Worker.cfg.lane.hub != hub {
			t.Fatal("the lanes do not share one wait")
		}
		workerKeys = append(workerKeys, l.Worker.keys.Notify("default"))
	}
	waitFor(t, outcomeWait, "every lane's worker waiting in the shared BLPOP", func() bool {
		blocking := blockingKeys(hub)
		for _, k := range workerKeys {
			if !blocking[k] {
				return false
			}
		}
		return true
	})
	// Let every lane look once since the shared wait began.
	lookCounts := func() []int64 {
		out := make([]int64, n)
		for k, l := range looks {
			out[k] = l.n.Load()
		}
		return out
	}
	waitLooks := func(from []int64, more int64) []int64 {
		t.Helper()
		var now []int64
		waitFor(t, outcomeWait, "every lane's dispatcher to look again", func() bool {
			now = lookCounts()
			for k := range now {
				if now[k] < from[k]+more {
					return false
				}
			}
			return true
		})
		return now
	}
	start := waitLooks(lookCounts(), 1)
	before := commandCalls(t, a)
	const idleWaits = 3
	end := waitLooks(start, idleWaits)
	after := commandCalls(t, a)
	if got := blockedPops(t, a); got != 1 {
		t.Errorf("%d clients blocked in BLPOP, want 1 for %d lanes", got, n)
	}
	var most int64
	for k := range end {
		most = max(most, end[k]-start[k])
	}
	delta := map[string]int64{}
	for c, v := range after {
		if d := v - before[c]; d > 0 {
			delta[c] = d
		}
	}
	t.Logf("idle, %d lanes on one server, %d to %d idle waits of each dispatcher: commands %v", n, idleWaits, most, delta)
	// Each idle wait of the shared BLPOP makes each dispatcher look once;
	// one more BLPOP may have begun as the window closed.
	if delta["blpop"] > most+1 {
		t.Errorf("%d BLPOPs while each dispatcher looked at most %d times: want one per idle wait for the server, not one per lane (%d lanes)", delta["blpop"], most, n)
	}
	if delta["lpush"] != 0 {
		t.Errorf("%d LPUSHes while idle: a waiting part that waits again should find its lists in the BLPOP under way", delta["lpush"])
	}
	redistest.RequireNoViolations(t, e.srv)
}

// TestShardSharedWaitDelayed: with the dispatchers of six lanes on one
// server in one BLPOP, a delayed task enqueued to each lane wakes that
// lane's dispatcher and runs on time: not before it is due, and long
// before the idle wait (a minute) would have made the dispatcher look.
func TestShardSharedWaitDelayed(t *testing.T) {
	t.Parallel()
	e := privateEnv(t)
	e.cfg.Advanced.IdleWait = 60 * time.Second
	const n = 6
	sh := e.sameServer(n)
	a := e.admin(t)
	rec := newRunRecorder()
	srv, err := newShardedServer(sh, e.cfg, rec.handler(), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	waitFor(t, outcomeWait, "the lanes' parts to block in one BLPOP", func() bool { return blockedPops(t, a) == 1 })
	c := e.shardedClient(t, sh)
	for round, delay := range []time.Duration{time.Second, 300 * time.Millisecond} {
		due := map[string]time.Time{}
		for k := range n {
			// Later lanes first: each wake names an earlier task than the
			// lane's dispatcher knows of (it knows of none).
			id := idInLane(fmt.Sprintf("d%d", round), n-1-k, n)
			at := time.Now().Add(delay + time.Duration(k)*50*time.Millisecond)
			if _, err := c.Enqueue(context.Background(), "job", nil, TaskID(id), At(at)); err != nil {
				t.Fatal(err)
			}
			due[id] = at
		}
		rec.requireOnTime(t, due, 15*time.Second)
		waitFor(t, outcomeWait, "the parts to block in one BLPOP again", func() bool { return blockedPops(t, a) == 1 })
	}
	redistest.RequireNoViolations(t, e.srv)
}

// TestShardSharedWaitServerDown: four lanes on two servers, two each.
// While one server is down, the dispatchers of the other server's lanes
// keep running delayed tasks on time (in their shared wait); the down
// server's lanes back off, and their tasks, written before it went down
// (appendfsync always), run once it is back.
func TestShardSharedWaitServerDown(t *testing.T) {
	t.Parallel()
	sa := redistest.Start(t, redistest.WithAppendOnly())
	sb := redistest.Start(t, redistest.WithAppendOnly())
	e := newEnv(t, sa)
	t.Cleanup(func() { sb.Cleanup(t, e.ns) })
	e.cfg.Advanced.IdleWait = 60 * time.Second
	pa, pb := sa.Pool(t), sb.Pool(t)
	sh := shardSpec{Pools: []*redis.Pool{pa, pb, pa, pb}}
	const n = 4
	rec := newRunRecorder()
	srv, err := newShardedServer(sh, e.cfg, rec.handler(), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	for _, s := range []*redistest.Server{sa, sb} {
		adm := s.Admin(t)
		waitFor(t, outcomeWait, "each server's lanes to block in one BLPOP", func() bool { return blockedPops(t, adm) == 1 })
	}
	c := e.shardedClient(t, sh)
	ctx := context.Background()
	enqueue := func(round string, lanes []int, delay time.Duration) map[string]time.Time {
		t.Helper()
		due := map[string]time.Time{}
		for _, k := range lanes {
			id := idInLane(round, k, n)
			at := time.Now().Add(delay)
			if _, err := c.Enqueue(ctx, "job", nil, TaskID(id), At(at)); err != nil {
				t.Fatal(err)
			}
			due[id] = at
		}
		return due
	}
	onB := enqueue("b", []int{1, 3}, 2*time.Second)
	sb.Kill(t)
	rec.requireOnTime(t, enqueue("a1", []int{0, 2}, 500*time.Millisecond), 15*time.Second)
	rec.requireOnTime(t, enqueue("a2", []int{0, 2}, 300*time.Millisecond), 15*time.Second)
	if got := rec.ranOf(onB); got != 0 {
		t.Fatalf("%d tasks of the down server's lanes ran", got)
	}
	sb.Restart(t)
	rec.requireRan(t, onB, 30*time.Second)
	rec.requireOnTime(t, enqueue("a3", []int{0, 1, 2, 3}, 500*time.Millisecond), 15*time.Second)
	redistest.RequireNoViolations(t, sa)
	redistest.RequireNoViolations(t, sb)
}

// runRecorder records when each task first ran.
type runRecorder struct {
	mu  sync.Mutex
	ran map[string]time.Time
}

func newRunRecorder() *runRecorder { return &runRecorder{ran: map[string]time.Time{}} }

func (r *runRecorder) handler() Handler {
	return HandlerFunc(func(_ context.Context, tk *Task) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, ok := r.ran[tk.ID]; !ok {
			r.ran[tk.ID] = time.Now()
		}
		return nil
	})
}

func (r *runRecorder) ranOf(due map[string]time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for id := range due {
		if _, ok := r.ran[id]; ok {
			n++
		}
	}
	return n
}

// requireRan waits until every task of due ran, none before it was due.
func (r *runRecorder) requireRan(t testing.TB, due map[string]time.Time, within time.Duration) {
	t.Helper()
	waitFor(t, within, "every task to run", func() bool { return r.ranOf(due) == len(due) })
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, at := range due {
		if got := r.ran[id]; got.Before(at) {
			t.Errorf("task %s ran at %v, before it was due at %v", id, got, at)
		}
	}
}

// requireOnTime is requireRan, and each task ran within `within` of its
// due time (the caller picks `within` well below IdleWait, so that only a
// wake-up can have made its dispatcher look in time).
func (r *runRecorder) requireOnTime(t testing.TB, due map[string]time.Time, within time.Duration) {
	t.Helper()
	var last time.Time
	for _, at := range due {
		if at.After(last) {
			last = at
		}
	}
	r.requireRan(t, due, time.Until(last)+within)
}

// TestShardClusterWait: on a real Redis Cluster, where keys of different
// slots cannot share a BLPOP, six lanes (six slots) served from one
// process block one connection per lane, shared by the lane's dispatcher
// and worker (not one per part), and a delayed task in every lane runs on
// time: not early, and long before the idle wait (a minute).
func TestShardClusterWait(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t)
	tc, err := topology.NewCluster(topology.ClusterOptions{Seeds: c.Addrs()[:1]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	ns := redistest.Namespace(t)
	const n = 6
	var sh shardSpec
	for k := range n {
		keys, err := buckets.NewLaneKeys(ns, k)
		if err != nil {
			t.Fatal(err)
		}
		sh.Pools = append(sh.Pools, tc.Pool(keys.Prefix()))
	}
	cfg := Config{Namespace: ns, Logger: testLogger(t), Advanced: AdvancedConfig{IdleWait: 60 * time.Second, HeartbeatInterval: 200 * time.Millisecond, HeartbeatTTL: time.Second, ReapInterval: 100 * time.Millisecond}}
	rec := newRunRecorder()
	srv, err := newShardedServer(sh, cfg, rec.handler(), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	var admins []redis.Conn
	for _, node := range c.Nodes {
		admins = append(admins, node.Conn(t))
	}
	blocked := func() int {
		total := 0
		for _, a := range admins {
			total += blockedPops(t, a)
		}
		return total
	}
	waitFor(t, outcomeWait, "one blocked connection per lane", func() bool { return blocked() == n })
	client, err := newShardedClient(sh, cfg)
	if err != nil {
		t.Fatal(err)
	}
	due := map[string]time.Time{}
	for k := range n {
		id := idInLane("c", k, n)
		at := time.Now().Add(time.Second)
		if _, err := client.Enqueue(context.Background(), "job", nil, TaskID(id), At(at)); err != nil {
			t.Fatal(err)
		}
		due[id] = at
	}
	rec.requireOnTime(t, due, 15*time.Second)
	waitFor(t, outcomeWait, "one blocked connection per lane again", func() bool { return blocked() == n })
}

// TestShardSharedWaitBusyLane: tokens that keep arriving on one lane's
// wake list, so that the shared BLPOP never times out, do not starve the
// other lanes' dispatchers of their idle looks: each still looks at its
// lane every IdleWait, as its own BLPOP's timeout would make it.
func TestShardSharedWaitBusyLane(t *testing.T) {
	t.Parallel()
	e := privateEnv(t)
	const n = 3
	sh := e.sameServer(n)
	srv, err := newShardedServer(sh, e.cfg, nil, RoleDispatcher)
	if err != nil {
		t.Fatal(err)
	}
	looks := make([]*lookCounter, n)
	for k, l := range srv.lanes {
		looks[k] = &lookCounter{mover: l.Dispatcher.moves}
		l.Dispatcher.moves = looks[k]
	}
	runBackground(t, srv.Run)
	a := e.admin(t)
	waitFor(t, outcomeWait, "the dispatchers to block in one BLPOP", func() bool { return blockedPops(t, a) == 1 })
	busy := srv.lanes[0].Dispatcher.store.Keys.Wake()
	stop := make(chan struct{})
	var pushes sync.WaitGroup
	pushes.Go(func() {
		c := e.srv.Admin(t)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := c.Do("LPUSH", busy, "1"); err != nil {
				t.Error(err)
				return
			}
		}
	})
	defer func() { close(stop); pushes.Wait() }()
	from := []int64{looks[1].n.Load(), looks[2].n.Load()}
	busyFrom := looks[0].n.Load()
	waitFor(t, outcomeWait, "the quiet lanes' dispatchers to look three times (IdleWait 1s) while lane 0's list is busy", func() bool {
		return looks[1].n.Load() >= from[0]+3 && looks[2].n.Load() >= from[1]+3
	})
	if got := looks[0].n.Load() - busyFrom; got < 6 {
		t.Errorf("lane 0's dispatcher looked %d times while its list got a token every 100 ms for three idle waits", got)
	}
}

// TestShardSharedWaitWrongType: a lane's wake list that holds a string
// fails the shared BLPOP of every lane of its server; the wait sets it
// aside, blocks again, and the lane's delayed task runs on time.
func TestShardSharedWaitWrongType(t *testing.T) {
	t.Parallel()
	e := privateEnv(t)
	e.cfg.Advanced.IdleWait = 60 * time.Second
	const n = 3
	sh := e.sameServer(n)
	a := e.admin(t)
	rec := newRunRecorder()
	srv, err := newShardedServer(sh, e.cfg, rec.handler(), AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	keys := srv.lanes[1].Dispatcher.store.Keys
	if _, err := a.Do("SET", keys.Wake(), "not a list"); err != nil {
		t.Fatal(err)
	}
	runBackground(t, srv.Run)
	waitFor(t, outcomeWait, "the bad wake list to be set aside and the lanes to block in one BLPOP", func() bool {
		return exists(t, a, keys.Quarantine(keys.Wake())) && blockedPops(t, a) == 1
	})
	c := e.shardedClient(t, sh)
	due := map[string]time.Time{}
	for k := range n {
		id := idInLane("wt", k, n)
		at := time.Now().Add(500 * time.Millisecond)
		if _, err := c.Enqueue(context.Background(), "job", nil, TaskID(id), At(at)); err != nil {
			t.Fatal(err)
		}
		due[id] = at
	}
	rec.requireOnTime(t, due, 15*time.Second)
}

// The lists of a worker's wait that timed out stay in every BLPOP of the
// hub for IdleWait, however many BLPOPs end meanwhile (a dispatcher's
// token ends one, and a look on a loaded machine can outlast several):
// when the worker waits on them again it finds them in the BLPOP under
// way and sends nothing. Past IdleWait they are left out.
func TestWaitHubKeepsTimedOutListsForIdleWait(t *testing.T) {
	t.Parallel()
	e := privateEnv(t)
	a := e.admin(t)
	const idle = 2 * time.Second
	h := newWaitHub(e.pool, e.key(""), idle, testLogger(t))
	defer h.close()
	dkey, q := e.key("wake"), e.key("n:default")
	wake, unsubscribe, err := h.subscribe(dkey)
	if err != nil {
		t.Fatal(err)
	}
	defer unsubscribe()
	ctx := context.Background()
	// endBLPOP ends the BLPOP under way with a token for the dispatcher
	// and waits for the next BLPOP's keys.
	endBLPOP := func() map[string]bool {
		t.Helper()
		select {
		case <-wake: // a BLPOP that timed out before: not this one
		default:
		}
		if _, err := a.Do("LPUSH", dkey, "1"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-wake:
		case <-time.After(outcomeWait):
			t.Fatal("the dispatcher's token was not delivered")
		}
		var keys map[string]bool
		waitFor(t, outcomeWait, "the next BLPOP", func() bool {
			keys = blockingKeys(h)
			return keys != nil
		})
		return keys
	}
	if k, err := h.pop(ctx, []string{q}, 100*time.Millisecond); k != "" || err != nil {
		t.Fatalf("first wait: %q, %v; want a timeout", k, err)
	}
	for i := 1; i <= 3; i++ {
		if keys := endBLPOP(); !keys[q] {
			t.Fatalf("BLPOP %d after the wait timed out does not name its list: %v", i, keys)
		}
	}
	pushes := e.srv.Census.Count("LPUSH")
	if k, err := h.pop(ctx, []string{q}, 100*time.Millisecond); k != "" || err != nil {
		t.Fatalf("second wait: %q, %v; want a timeout", k, err)
	}
	if n := e.srv.Census.Count("LPUSH") - pushes; n != 0 {
		t.Errorf("waiting again on the same list sent %d LPUSHes, want none (its list is in the BLPOP under way)", n)
	}
	// The second wait timed out too: past IdleWait from then, its list
	// is left out of the BLPOPs.
	left := time.Now()
	waitFor(t, outcomeWait, "a BLPOP without the list", func() bool {
		keys := blockingKeys(h)
		return keys != nil && !keys[q]
	})
	if d := time.Since(left); d < idle-100*time.Millisecond {
		t.Errorf("the list left the BLPOPs %v after its wait timed out, before IdleWait (%v)", d, idle)
	}
}
