package chaos

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/redisinfo"
	"github.com/gomodule/redigo/redis"
)

// Options configure one run of one scenario.
type Options struct {
	Scenario string
	// Tasks is how many tasks the producers get acknowledged in all.
	// Default 3000.
	Tasks int
	// Seed drives every random choice of the harness and its processes:
	// which process is killed when, with which signal, cut probabilities,
	// batch sizes, delays, handler sleeps. 0 picks one (it is reported).
	// A replay with the same seed makes the same choices; the operating
	// system's timing still differs.
	Seed int64
	// Duration is how long the producers take to enqueue Tasks. Default
	// Tasks/1500 s, at least 5 s.
	Duration time.Duration
	// DelayMax is the longest delay of a delayed task: the faults go on
	// until the last one is due. Default DelayMax.
	DelayMax time.Duration
	// Drain bounds the wait, after faults stop, for the last tasks to run.
	// Default 30 s.
	Drain time.Duration
	// Dir is the work directory (ledgers, logs, the server's files).
	// Default: a new temporary directory, removed after a passing run
	// unless Keep is set.
	Dir  string
	Keep bool
	// Bin is a chaosproc binary; default: built into Dir.
	Bin string
	// Race builds chaosproc with the race detector.
	Race bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// ProcArgs are extra chaosproc flags for every process, e.g.
	// "-done-retention=-1s" (see chaosproc -h).
	ProcArgs []string
	// Shards, when 2 or more, runs the scenario on that many lanes, each
	// on a redis-server of its own (shard.go): every process serves or
	// writes every lane, restarts hit one server at a time, and the
	// ledger and the namespace check span the lanes. A scenario's
	// cutting proxy stands in front of every server (one proxy each, its
	// own seeded cuts), and its bad data goes into the keys of one lane
	// the seed picks.
	Shards int
	// Redis24 is the path of a Redis 2.4 redis-server to run the scenario
	// on instead of the one findRedisServer finds.
	Redis24 string

	// For the harness's own tests: a scenario not in the list, and
	// damage done behind the engine's back that the check must catch.
	scenario *Scenario
	sabotage func(ctx context.Context, h *harness)
}

// The engine settings every process runs with: short, so that recovery
// is quick. Delays are drawn from [0, DelayMax); 30% of tasks are due at
// once.
const (
	MaxPayload        = 64 << 10
	TaskTimeout       = 5 * time.Second
	LeaseGrace        = 2 * time.Second
	HeartbeatInterval = 200 * time.Millisecond
	HeartbeatTTL      = time.Second
	ReapInterval      = 200 * time.Millisecond
	IdleWait          = time.Second
	ShutdownTimeout   = 5 * time.Second
	RetryBackoff      = 100 * time.Millisecond // times the attempt, at most 1 s
	DelayMax          = 5 * time.Second
)

// engineArgs are the chaosproc flags of those settings.
func engineArgs() []string {
	return []string{
		"-max-payload", fmt.Sprint(MaxPayload),
		"-timeout", TaskTimeout.String(),
		"-lease-grace", LeaseGrace.String(),
		"-hb-interval", HeartbeatInterval.String(),
		"-hb-ttl", HeartbeatTTL.String(),
		"-reap-interval", ReapInterval.String(),
		"-idle-wait", IdleWait.String(),
		"-shutdown-timeout", ShutdownTimeout.String(),
		"-backoff", RetryBackoff.String(),
	}
}

type killEvent struct {
	Role, Name  string
	PID         int
	Signal      syscall.Signal
	Self        bool // a producer's own SIGKILL, armed before a call
	At          time.Time
	WorkerID    string
	WorkerIDs   []string // a worker's ids, one per lane
	Pending     []string // the worker's pending set right after it died
	Inflight    []string // and its in-flight list
	SnapshotErr error
}

type restartEvent struct {
	Signal syscall.Signal
	At     time.Time
	Down   time.Duration
}

type harness struct {
	// injecting is held while the bad-data injector sets up its items
	// (its own commands are not a fault target): a Redis restart waits
	// for it, and the injector waits for a restart to finish.
	injecting sync.Mutex

	opts  Options
	sc    Scenario
	seed  int64
	dir   string
	bin   string
	ns    string
	redis *redisServer
	// proxies are the cutting proxies, one in front of each lane's
	// server (lane 0's first), when the scenario cuts connections.
	proxies  []*proxy
	procAddr string
	procArgs []string
	// workerArgs are extra flags of workers.
	workerArgs []string
	admin      *redis.Pool
	client     *engine.Client
	clientPool *redis.Pool
	// lanes are the namespace's lanes (one, the above, unless sharded),
	// and laneAddrs their servers' addresses for the processes.
	lanes     []*lane
	laneAddrs string
	rate      float64
	started   time.Time

	mu       sync.Mutex
	procs    []*proc
	crashes  []crash
	stopping bool
	slots    map[string][]*slot
	kills    []*killEvent
	restarts []restartEvent
	bad      *badData
	// lostBeforeStop is where the outstanding tasks were when the drain
	// gave up, before stopping the workers moved their in-flight tasks.
	lostBeforeStop map[string]location
	// turnHeld of turnSamples looks at the dispatch turn found it held
	// (Scenario.Turn).
	turnHeld, turnSamples atomic.Int64
	// turnKills counts watchTurn's kills of every dispatcher.
	turnKills atomic.Int64
	// fills counts fullLoop's fills of a server (Scenario.Full), and
	// evicted the keys the servers evicted meanwhile (INFO evicted_keys).
	fills, evicted atomic.Int64
	partialWhere   map[string]*partialWhere
	// notFired names the fault loops untilFaultsFired gave up waiting for.
	notFired []string
	// replayArgs are the chaos command's flags that replay the options
	// (Report.replayArgs).
	replayArgs string
}

func (h *harness) logf(format string, args ...any) {
	if h.opts.Log == nil {
		return
	}
	el := time.Since(h.started).Seconds()
	fmt.Fprintf(h.opts.Log, "[%s %6.1fs] %s\n", h.sc.Name, el, fmt.Sprintf(format, args...))
}

func hash(parts ...any) uint64 {
	f := fnv.New64a()
	for _, p := range parts {
		fmt.Fprint(f, p, "\x00")
	}
	return f.Sum64()
}

// seedFor is the seed of a process incarnation or a fault loop: a function
// of the run's seed and the name only.
func (h *harness) seedFor(name string) uint64 { return hash(h.seed, name) }

func (h *harness) rngFor(name string) *rand.Rand {
	s := h.seedFor(name)
	return rand.New(rand.NewPCG(s, s^0xc0ffee))
}

func (h *harness) producerArgs(s *slot, inc, count int) []string {
	queue := "default"
	if h.sc.BadData >= 2 && s.Index == h.sc.Producers-1 {
		queue = "side"
	}
	return []string{
		"-count", fmt.Sprint(count),
		"-rate", fmt.Sprintf("%.1f", h.rate/float64(h.sc.Producers)),
		"-batch-max", fmt.Sprint(h.sc.BatchMax),
		"-pad", fmt.Sprint(h.sc.Pad),
		"-prefix", fmt.Sprintf("p%d.%d", s.Index, inc),
		"-queue", queue,
		"-delay-max", h.opts.DelayMax.String(),
		"-self-kill", fmt.Sprint(h.sc.ProducerSelfKill), "-self-kill-max", "1500us",
		"-keys", fmt.Sprint(h.sc.Keys), "-expire", fmt.Sprint(h.sc.Expire),
	}
}

// Run runs one scenario and checks it. The error is for a run that could
// not be carried out; a run that found the engine at fault returns a
// Report whose Failures say why.
func Run(ctx context.Context, o Options) (*Report, error) {
	sc, err := LookupScenario(o.Scenario)
	if o.scenario != nil {
		sc, err = *o.scenario, nil
	}
	if err != nil {
		return nil, err
	}
	if o.Tasks <= 0 {
		o.Tasks = 3000
	}
	if o.Seed == 0 {
		o.Seed = time.Now().UnixNano()%1_000_000_000 + 1
	}
	var replay strings.Builder
	if o.Duration > 0 {
		fmt.Fprintf(&replay, " -duration %v", o.Duration)
	}
	if o.DelayMax > 0 {
		fmt.Fprintf(&replay, " -delay-max %v", o.DelayMax)
	}
	if o.Redis24 != "" {
		replay.WriteString(" -on24")
	}
	if o.Duration <= 0 {
		o.Duration = max(5*time.Second, sc.MinDuration, time.Duration(float64(o.Tasks)/1500*float64(time.Second)))
	}
	if o.Drain <= 0 {
		o.Drain = 30 * time.Second
	}
	o.Drain = max(o.Drain, sc.MinDrain)
	if o.DelayMax <= 0 {
		o.DelayMax = DelayMax
	}
	h := &harness{opts: o, sc: sc, seed: o.Seed, ns: "chaos", started: time.Now(), slots: map[string][]*slot{},
		replayArgs: replay.String()}
	h.rate = float64(o.Tasks) / o.Duration.Seconds()
	if sc.RateShare > 0 {
		// The windows scale with the run: the queue's rate a share of
		// the pace tasks are produced at, each key's half of that, so
		// that the key with half the tasks is held by its own window
		// and the queue's binds the others together.
		n := max(1, int(math.Ceil(h.rate*sc.RateShare)))
		h.sc.Rate = fmt.Sprintf("%d/1s", n)
		h.sc.KeyRate = fmt.Sprintf("%d/1s", max(1, (n+1)/2))
	}
	rbin, err := findRedisServer()
	if err != nil {
		return nil, err
	}
	h.dir = o.Dir
	if h.dir == "" {
		if h.dir, err = os.MkdirTemp("", "chaos-"+sc.Name+"-"); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"logs", "ledgers", "ids", "redis"} {
		if err := os.MkdirAll(filepath.Join(h.dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	h.logf("seed %d, %d tasks over %v, work dir %s", o.Seed, o.Tasks, o.Duration, h.dir)
	h.bin = o.Bin
	if h.bin == "" {
		if h.bin, err = BuildProc(ctx, h.dir, o.Race); err != nil {
			return nil, err
		}
	}
	h.redis, err = startRedis(rbin, filepath.Join(h.dir, "redis"), redisOptions{
		appendOnly: sc.Restarts > 0, timeout: sc.ServerTimeout, bin24: o.Redis24})
	if err != nil {
		return nil, err
	}
	defer h.redis.Stop(syscall.SIGKILL)
	h.procAddr = h.redis.Addr
	if sc.Cuts != nil {
		px, err := newProxy(h.redis.Addr, *sc.Cuts, h.seedFor("proxy"))
		if err != nil {
			return nil, err
		}
		h.proxies = append(h.proxies, px)
		defer h.closeProxies()
		h.procAddr = px.Addr()
	}
	h.admin = h.redis.AdminPool()
	defer h.admin.Close()
	h.clientPool = &redis.Pool{MaxIdle: 4, IdleTimeout: 500 * time.Millisecond,
		Dial: func() (redis.Conn, error) {
			return redis.Dial("tcp", h.redis.Addr, redis.DialConnectTimeout(2*time.Second),
				redis.DialReadTimeout(10*time.Second), redis.DialWriteTimeout(10*time.Second))
		},
		TestOnBorrow: func(c redis.Conn, _ time.Time) error { _, err := c.Do("PING"); return err }}
	defer h.clientPool.Close()
	if h.client, err = engine.NewClient(engine.Config{Namespace: h.ns, MaxPayload: MaxPayload}, h.clientPool); err != nil {
		return nil, err
	}
	if err := h.startLanes(rbin, o.Shards); err != nil {
		return nil, err
	}
	defer h.stopLanes()
	h.procArgs = append(engineArgs(), sc.ProcArgs...)
	if sc.SleepMax > 0 {
		h.procArgs = append(h.procArgs, "-sleep-max", sc.SleepMax.String())
	}
	if sc.BadData >= 2 {
		h.workerArgs = append(h.workerArgs, "-queues", "default,side")
	}
	if sc.MaxRunning > 0 {
		h.workerArgs = append(h.workerArgs, "-max-running", fmt.Sprint(sc.MaxRunning))
	}
	if sc.KeyMaxRunning > 0 {
		h.workerArgs = append(h.workerArgs, "-key-max-running", fmt.Sprint(sc.KeyMaxRunning))
	}
	if h.sc.Rate != "" {
		h.workerArgs = append(h.workerArgs, "-queue-rate", h.sc.Rate)
	}
	if h.sc.KeyRate != "" {
		h.workerArgs = append(h.workerArgs, "-key-rate", h.sc.KeyRate)
	}

	rep, err := h.run(ctx)
	if err != nil {
		h.stopAll()
		return nil, err
	}
	if rep.OK() && o.Dir == "" && !o.Keep {
		os.RemoveAll(h.dir)
		rep.Dir = h.dir + " (removed)"
	}
	return rep, nil
}

// offset is the clock offset of a slot: in the skew scenarios the slots
// of each role take turns at -2 s, +2 s and 0 (dispatchers first ahead,
// so that both extremes face each other).
func (h *harness) offset(role string, i int) time.Duration {
	if !h.sc.Skew {
		return 0
	}
	cycle := []time.Duration{-Skew, Skew, 0}
	if role == roleDispatcher || role == roleReaper {
		cycle = []time.Duration{Skew, -Skew, 0}
	}
	return cycle[i%3]
}

func (h *harness) addSlots(role string, n int) []*slot {
	var out []*slot
	for i := 0; i < n; i++ {
		s := &slot{Role: role, Index: i, Offset: h.offset(role, i), doneC: make(chan struct{})}
		out = append(out, s)
	}
	h.mu.Lock()
	h.slots[role] = out
	h.mu.Unlock()
	return out
}

func (h *harness) run(ctx context.Context) (*Report, error) {
	sc := h.sc
	for _, r := range []struct {
		role string
		n    int
	}{{roleDispatcher, sc.Dispatchers}, {roleReaper, sc.Reapers}, {roleWorker, sc.Workers}} {
		for _, s := range h.addSlots(r.role, r.n) {
			if _, err := h.start(s, 0); err != nil {
				return nil, err
			}
		}
	}
	// Wait for the workers to be up.
	deadline := time.Now().Add(15 * time.Second)
	for _, s := range h.slots[roleWorker] {
		for s.current().workerID() == "" {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("chaos: worker %s did not start; log:\n%s", s.current().Name, tail(s.current().LogPath, 20))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	h.enableCuts(true)
	h.logf("%d dispatchers, %d reapers, %d workers x %d up; producing", sc.Dispatchers, sc.Reapers, sc.Workers, sc.Concurrency)

	faultCtx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	var loops sync.WaitGroup
	goLoop := func(f func(context.Context)) {
		loops.Add(1)
		go func() { defer loops.Done(); f(faultCtx) }()
	}
	if sc.BadData > 0 {
		h.bad = newBadData(h)
		goLoop(h.bad.inject)
	}
	if sc.Turn {
		goLoop(h.watchTurn)
	}
	if h.opts.sabotage != nil {
		goLoop(func(ctx context.Context) { h.opts.sabotage(ctx, h) })
	}
	prods := h.addSlots(roleProducer, sc.Producers)
	per := h.opts.Tasks / sc.Producers
	for i, s := range prods {
		s.Target = per
		if i == 0 {
			s.Target += h.opts.Tasks - per*sc.Producers
		}
		if _, err := h.start(s, s.Target); err != nil {
			return nil, err
		}
	}
	if sc.KillWorkers > 0 {
		goLoop(func(ctx context.Context) {
			h.killLoop(ctx, "kill-workers", []string{roleWorker}, sc.KillWorkers, sc.TermWorkers)
		})
	}
	if sc.KillInfra > 0 {
		goLoop(func(ctx context.Context) {
			h.killLoop(ctx, "kill-infra", []string{roleDispatcher, roleReaper}, sc.KillInfra, 0)
		})
	}
	if sc.KillProducers > 0 {
		goLoop(func(ctx context.Context) {
			h.killLoop(ctx, "kill-producers", []string{roleProducer}, sc.KillProducers, 0)
		})
	}
	if sc.Restarts > 0 {
		goLoop(h.restartLoop)
	}
	if sc.Full > 0 {
		goLoop(h.fullLoop)
	}

	// Production.
	prodDeadline := time.After(3*h.opts.Duration + 60*time.Second)
	for _, s := range prods {
		select {
		case <-s.doneC:
		case <-prodDeadline:
			stopFaults()
			loops.Wait()
			return h.finish(ctx, fmt.Sprintf("production did not finish within %v", 3*h.opts.Duration+60*time.Second))
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	h.logf("producers done")
	// Keep the faults on until the last delayed task is due.
	obs, _ := h.collect()
	if obs != nil {
		last := obs.maxDue()
		if d := time.Until(time.UnixMilli(last)) + 500*time.Millisecond; d > 0 {
			sleep(ctx, min(d, h.opts.DelayMax+Skew+time.Second))
		}
	}
	h.untilFaultsFired(ctx)
	stopFaults()
	loops.Wait()
	h.enableCuts(false)
	h.logf("faults stopped; draining")
	return h.finish(ctx, "")
}

// faultsFiredWait bounds untilFaultsFired.
const faultsFiredWait = 30 * time.Second

// untilFaultsFired keeps the faults on until every fault loop of the
// scenario that can still fire once production is over fired at least
// once (a worker, dispatcher or reaper killed, a server restarted or
// filled, a connection cut), or faultsFiredWait: a short run then
// injects every fault it is for, whatever its draws of the gaps. A fault
// still not injected then is kept in notFired: the run did not exercise
// it. Producer kills are left out: they can only fire while producers
// run.
func (h *harness) untilFaultsFired(ctx context.Context) {
	deadline := time.Now().Add(faultsFiredWait)
	for {
		missing := h.faultsNotFired()
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.logf("after %v, still not injected: %s", faultsFiredWait, strings.Join(missing, ", "))
			h.notFired = missing
			return
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return
		}
	}
}

// faultsNotFired names the scenario's fault loops, of those
// untilFaultsFired waits for, that did not fire yet.
func (h *harness) faultsNotFired() []string {
	sc := h.sc
	h.mu.Lock()
	killed := map[string]bool{}
	for _, k := range h.kills {
		killed[k.Role] = true
	}
	restarted := len(h.restarts) > 0
	h.mu.Unlock()
	var missing []string
	if sc.KillWorkers > 0 && !killed[roleWorker] {
		missing = append(missing, "worker kill")
	}
	if sc.KillInfra > 0 && !killed[roleDispatcher] && !killed[roleReaper] {
		missing = append(missing, "dispatcher or reaper kill")
	}
	if sc.Restarts > 0 && !restarted {
		missing = append(missing, "redis-server restart")
	}
	if sc.Full > 0 && h.fills.Load() == 0 {
		missing = append(missing, "server full")
	}
	if len(h.proxies) > 0 {
		if _, n := h.cuts(); n == 0 {
			missing = append(missing, "connection cut")
		}
	}
	return missing
}

// finish drains, stops every process and checks.
func (h *harness) finish(ctx context.Context, failure string) (*Report, error) {
	drained := h.drain(ctx)
	if !drained {
		if obs, err := h.collect(); err == nil {
			if dead, err := h.deadSet(); err == nil {
				var ids []string
				for id := range obs.acked {
					if len(obs.runs[id]) == 0 && !dead[id] {
						ids = append(ids, id)
					}
				}
				h.lostBeforeStop = h.locate(ids)
			}
			h.partialWhere = h.partialLocations(obs)
		}
	}
	if h.bad != nil {
		h.bad.settle(ctx)
	}
	h.stopAll()
	rep := h.check(ctx)
	rep.Failures = append(rep.Failures, h.checkNamespace(ctx)...)
	srvs := make([]*redisServer, len(h.lanes))
	for k, l := range h.lanes {
		srvs[k] = l.srv
	}
	rep.Failures = append(rep.Failures, replayFailures(srvs)...)
	if failure != "" {
		rep.Failures = append([]string{failure}, rep.Failures...)
	}
	if !drained {
		rep.Notes = append(rep.Notes, fmt.Sprintf("drain timed out after %v", h.opts.Drain))
	}
	if len(h.notFired) > 0 {
		rep.Unexercised = append(rep.Unexercised, "faults never injected: "+strings.Join(h.notFired, ", "))
	}
	if h.sc.Full > 0 {
		refused := h.logCount("maxmemory")
		rep.Notes = append(rep.Notes, fmt.Sprintf("server filled %d times for %v each; %d log lines of the processes name a maxmemory refusal; %d keys evicted", h.fills.Load(), FullFor, refused, h.evicted.Load()))
		if h.fills.Load() == 0 || refused == 0 {
			rep.Unexercised = append(rep.Unexercised, "no write was seen refused for memory (a full server)")
		}
	}
	if h.sc.Turn {
		held, samples := h.turnHeld.Load(), h.turnSamples.Load()
		rep.Notes = append(rep.Notes, fmt.Sprintf("dispatch turn held in %d of %d samples (every %v); every dispatcher killed %d times while it was held", held, samples, turnSampleEvery, h.turnKills.Load()))
		if held == 0 {
			rep.Unexercised = append(rep.Unexercised, "the dispatch turn was never seen held")
		}
	}
	return rep, nil
}

// turnSampleEvery is how often watchTurn looks at the dispatch turn.
const turnSampleEvery = 5 * time.Millisecond

// turnKillGap is the least time between two kills of every dispatcher by
// watchTurn.
const turnKillGap = 4 * time.Second

// watchTurn samples whether a dispatcher holds the dispatch turn of any
// lane (each lane's server has its own) until ctx ends. Seeing it held, it
// kills every dispatcher at once (SIGKILL), the holder among them, at most
// every turnKillGap, and restarts them: the turn of a dead holder must end
// on its own, and the restarted dispatchers take the backlog over. A turn
// over one lane's share of a sharded backlog can be held for less than a
// sampling interval, so one lane alone may go unseen for a whole run.
func (h *harness) watchTurn(ctx context.Context) {
	rng := h.rngFor("turn-kills")
	var last time.Time
	t := time.NewTicker(turnSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		read, held := false, false
		for _, l := range h.lanes {
			c := l.admin.Get()
			n, err := redis.Int(c.Do("EXISTS", l.keys.Turn()))
			c.Close()
			if err != nil {
				continue // a restart or a cut: no sample of this lane
			}
			read = true
			held = held || n == 1
		}
		if !read {
			continue
		}
		h.turnSamples.Add(1)
		if !held {
			continue
		}
		h.turnHeld.Add(1)
		if time.Since(last) < turnKillGap {
			continue
		}
		last = time.Now()
		h.turnKills.Add(1)
		var wg sync.WaitGroup
		for _, s := range h.liveSlots(roleDispatcher) {
			pause := restartPause(rng)
			wg.Go(func() { h.killAndRestart(s, syscall.SIGKILL, pause) })
		}
		wg.Wait()
	}
}

// drain waits until every acknowledged task ran or is a dead letter, and
// every batch that started running ran whole, or the drain timeout.
func (h *harness) drain(ctx context.Context) bool {
	deadline := time.Now().Add(h.opts.Drain)
	lastLog := time.Now()
	for {
		obs, err := h.collect()
		waiting := -1
		if err == nil {
			dead, derr := h.deadSet()
			if derr == nil {
				waiting = obs.outstanding(dead)
			}
		}
		if waiting == 0 {
			h.logf("drained")
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			h.logf("drain timed out with %d outstanding", waiting)
			return false
		}
		if time.Since(lastLog) > 5*time.Second {
			h.logf("draining: %d outstanding", waiting)
			lastLog = time.Now()
		}
		sleep(ctx, 300*time.Millisecond)
	}
}

// stopAll stops every process gracefully (SIGTERM).
func (h *harness) stopAll() {
	h.mu.Lock()
	h.stopping = true
	var cur []*proc
	for _, ss := range h.slots {
		for _, s := range ss {
			if p := s.current(); p != nil && p.alive() {
				cur = append(cur, p)
			}
		}
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range cur {
		wg.Add(1)
		go func() { defer wg.Done(); h.signal(p, syscall.SIGTERM) }()
	}
	wg.Wait()
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// killLoop kills a random live process of the roles every mean (0.5-1.5
// times it), with SIGTERM for a share term of them, and restarts it.
func (h *harness) killLoop(ctx context.Context, name string, roles []string, mean time.Duration, term float64) {
	rng := h.rngFor(name)
	for {
		if !sleep(ctx, time.Duration((0.5+rng.Float64())*float64(mean))) {
			return
		}
		cands := h.liveSlots(roles...)
		if len(cands) == 0 {
			continue
		}
		s := cands[rng.IntN(len(cands))]
		sig := syscall.SIGKILL
		if rng.Float64() < term {
			sig = syscall.SIGTERM
		}
		h.killAndRestart(s, sig, restartPause(rng))
	}
}

// restartPause draws how long a killed process stays down: 50-400 ms.
func restartPause(rng *rand.Rand) time.Duration {
	return time.Duration(50+rng.IntN(350)) * time.Millisecond
}

// killAndRestart kills the current process of s with sig and restarts
// it after pause.
func (h *harness) killAndRestart(s *slot, sig syscall.Signal, pause time.Duration) {
	h.kill(s, sig)
	sleep(context.Background(), pause)
	h.restart(s)
}

// liveSlots returns the slots of the roles whose current process runs
// and is not done.
func (h *harness) liveSlots(roles ...string) []*slot {
	var live []*slot
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range roles {
		for _, s := range h.slots[r] {
			s.mu.Lock()
			if s.cur != nil && s.cur.alive() && !s.done {
				live = append(live, s)
			}
			s.mu.Unlock()
		}
	}
	return live
}

// kill signals the current process of s, waits for it to exit, and for a
// killed worker records what it held.
func (h *harness) kill(s *slot, sig syscall.Signal) {
	p := s.current()
	ev := &killEvent{Role: p.Role, Name: p.Name, PID: p.PID, Signal: sig}
	ev.WorkerID, ev.WorkerIDs = p.workerID(), p.workerIDs()
	h.signal(p, sig)
	ev.At = time.Now()
	if p.Role == roleWorker && sig == syscall.SIGKILL && ev.WorkerID != "" {
		ev.Pending, ev.Inflight, ev.SnapshotErr = h.workerHoldings(p.workerIDs())
	}
	h.mu.Lock()
	h.kills = append(h.kills, ev)
	h.mu.Unlock()
}

// workerHoldings reads what a worker process held: its pending sets and
// in-flight lists, ids[k] being its worker id in lane k.
func (h *harness) workerHoldings(ids []string) (pending, inflight []string, err error) {
	for k, w := range ids {
		if k >= len(h.lanes) {
			break
		}
		l := h.lanes[k]
		c := l.admin.Get()
		p, err := redis.Strings(c.Do("ZRANGE", l.keys.Pending(w), 0, -1))
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		f, err := redis.Strings(c.Do("LRANGE", l.keys.Inflight(w), 0, -1))
		c.Close()
		if err != nil {
			return nil, nil, err
		}
		pending, inflight = append(pending, p...), append(inflight, f...)
	}
	return pending, inflight, nil
}

// restartLoop stops redis-server with SIGTERM or SIGKILL every mean
// (0.5-1.5 times it) and starts it again after 0.2-1.5 s.
func (h *harness) restartLoop(ctx context.Context) {
	rng := h.rngFor("restart-redis")
	for {
		if !sleep(ctx, time.Duration((0.5+rng.Float64())*float64(h.sc.Restarts))) {
			return
		}
		sig := syscall.SIGTERM
		if rng.IntN(2) == 0 {
			sig = syscall.SIGKILL
		}
		down := time.Duration(200+rng.IntN(1300)) * time.Millisecond
		srv := h.lanes[rng.IntN(len(h.lanes))].srv
		h.injecting.Lock()
		at := time.Now()
		srv.Stop(sig)
		time.Sleep(down)
		for {
			err := srv.Start()
			if err == nil {
				break
			}
			h.logf("redis restart failed (retrying): %v", err)
			time.Sleep(500 * time.Millisecond)
		}
		h.injecting.Unlock()
		h.mu.Lock()
		h.restarts = append(h.restarts, restartEvent{Signal: sig, At: at, Down: time.Since(at)})
		h.mu.Unlock()
		h.logf("redis-server %v, back after %v", sig, time.Since(at).Round(time.Millisecond))
	}
}

// FullFor is how long fullLoop keeps a server full each time.
const FullFor = 150 * time.Millisecond

// fullLoop fills a lane's server every Scenario.Full (0.5-1.5 times it):
// maxmemory just below the memory in use, so that every write is refused
// (and a volatile policy evicts keys with a TTL), for FullFor; then no
// limit again. The limit is lifted whatever happens, also at the end.
func (h *harness) fullLoop(ctx context.Context) {
	rng := h.rngFor("full")
	for {
		if !sleep(ctx, time.Duration((0.5+rng.Float64())*float64(h.sc.Full))) {
			return
		}
		l := h.lanes[rng.IntN(len(h.lanes))]
		evicted, err := fillFor(l.admin, FullFor, h.sc.Policy)
		if err != nil {
			h.logf("fill the server: %v", err)
			continue
		}
		h.fills.Add(1)
		h.evicted.Add(evicted)
	}
}

// fillFor sets maxmemory just below used_memory (and, when policy is
// set, maxmemory-policy to it), waits d, and lifts it. It returns how
// many keys the server evicted meanwhile.
func fillFor(admin *redis.Pool, d time.Duration, policy string) (int64, error) {
	c := admin.Get()
	defer func() { c.Close() }()
	before, err := infoFields(c)
	if err != nil {
		return 0, err
	}
	used, _ := strconv.ParseInt(before["used_memory"], 10, 64)
	if used < 2 {
		return 0, fmt.Errorf("INFO gave no used_memory")
	}
	if policy != "" {
		if _, err := c.Do("CONFIG", "SET", "maxmemory-policy", policy); err != nil {
			return 0, err
		}
	}
	if _, err := c.Do("CONFIG", "SET", "maxmemory", used-1); err != nil {
		return 0, err
	}
	// Real time is what is tested: how long the server stays full.
	time.Sleep(d)
	for try := 0; ; try++ {
		_, err = c.Do("CONFIG", "SET", "maxmemory", 0)
		if err == nil || try == 20 {
			break
		}
		c.Close()
		c = admin.Get()
	}
	if err != nil {
		return 0, err
	}
	after, err := infoFields(c)
	if err != nil {
		return 0, err
	}
	a, _ := strconv.ParseInt(after["evicted_keys"], 10, 64)
	b, _ := strconv.ParseInt(before["evicted_keys"], 10, 64)
	return max(a-b, 0), nil
}

// infoFields is INFO (no section: the 2.4 form) as a map.
func infoFields(c redis.Conn) (map[string]string, error) {
	info, err := redis.String(c.Do("INFO"))
	if err != nil {
		return nil, err
	}
	return redisinfo.Fields(info), nil
}

// logCount counts the lines of every process's log that contain s.
func (h *harness) logCount(s string) int {
	n := 0
	for _, p := range h.allProcs() {
		b, err := os.ReadFile(p.LogPath)
		if err != nil {
			continue
		}
		n += strings.Count(string(b), s)
	}
	return n
}

// deadSet lists the dead letters' ids, of every lane.
func (h *harness) deadSet() (map[string]bool, error) {
	out := map[string]bool{}
	for _, l := range h.lanes {
		c := l.admin.Get()
		ids, err := redis.Strings(c.Do("ZRANGE", l.keys.Dead(), 0, -1))
		c.Close()
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			out[id] = true
		}
	}
	return out, nil
}

// allProcs returns every process incarnation, in start order.
func (h *harness) allProcs() []*proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	ps := append([]*proc(nil), h.procs...)
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Started.Before(ps[j].Started) })
	return ps
}
