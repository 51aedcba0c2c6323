package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/chaos/ledger"
	"github.com/bucketq/bucketq/internal/schedule"
	"github.com/gomodule/redigo/redis"
)

// PeriodicOptions configure RunPeriodic.
type PeriodicOptions struct {
	Bin      string        // chaosproc (BuildProc)
	Dir      string        // logs and the ledger; a temporary directory when empty
	Duration time.Duration // the window of kills; default 30 s
	Seed     uint64
	Log      io.Writer // progress; nil for none
	// Outage, when set, stops every scheduler after the window for this
	// long (more than the 10 s horizon) and restarts one: the entry's
	// missed policy ("once") must run exactly the latest missed firing.
	Outage time.Duration
	// Shards, when 2 or more, runs the scenario on that many lanes, each
	// on a redis-server of its own: the schedulers declare the entry in
	// lane 0 (where ShardedServer.AddPeriodic keeps it, so that it fires
	// once, not once per lane), and the dispatcher, reaper and worker are
	// ShardedServers of every lane.
	Shards int
}

// creationSkew is the engine's default Scheduler.MaxSkew: the firings of
// that long after the entry's creation are not judged (see RunPeriodic).
const creationSkew = 2 * time.Second

// PeriodicReport is what RunPeriodic measured over its window.
type PeriodicReport struct {
	Dir       string
	Window    [2]time.Time // firings in (Window[0], Window[1]] are judged
	Firings   int          // firings in the window
	Ran       int          // of them, run at least once
	Missing   []string     // firings that never ran
	Duplicate []string     // firings run more than once (the worker is never killed: no lease loss)
	Early     []string     // runs started before their firing time (real clock), or with a Due that is not the firing
	Kills     int          // SIGKILLs of scheduler processes
	Check     []string     // the namespace check's findings once every process has stopped (a gauge that disagrees with the structures, a task out of place)
	// After the outage: the watermark when every scheduler was down, the
	// restart, the missed firings up to a second before the restart
	// (policy "once" runs none of them) and the first firing that ran
	// after the watermark (the latest missed one).
	OutageFrom, Restart time.Time
	OutageSkipped       int
	FirstRun            time.Time
	Failures            []string
}

// OK reports whether the run found nothing wrong.
func (r *PeriodicReport) OK() bool { return len(r.Failures) == 0 }

func (r *PeriodicReport) String() string {
	s := fmt.Sprintf("periodic: window %s..%s, %d firings, %d ran, %d missing, %d duplicate, %d early, %d scheduler kills",
		r.Window[0].Format("15:04:05.000"), r.Window[1].Format("15:04:05.000"), r.Firings, r.Ran,
		len(r.Missing), len(r.Duplicate), len(r.Early), r.Kills)
	if !r.Restart.IsZero() {
		s += fmt.Sprintf("; outage from watermark %s to restart %s: %d missed firings skipped, the next run is the firing at %s (policy once)",
			r.OutageFrom.Format("15:04:05.000"), r.Restart.Format("15:04:05.000"), r.OutageSkipped, r.FirstRun.Format("15:04:05.000"))
	}
	return s + "; dir " + r.Dir
}

// periodicEntry is the entry of the periodic scenario.
const periodicEntry = "chaos-tick"

// RunPeriodic is the periodic scenario: three scheduler processes declare
// the same `every: 1s` entry, with clocks offset by -2 s, 0 and +2 s, and
// are SIGKILLed and restarted at random (never all down longer than a
// second, far less than the horizon); one dispatcher, reaper and worker on
// the real clock run the firings. It then checks that every firing of the
// window ran exactly once, none before its firing time, with the firing
// time as its Due, and that the namespace check (every gauge against the
// structures) finds nothing once every process has stopped.
func RunPeriodic(ctx context.Context, o PeriodicOptions) (*PeriodicReport, error) {
	if o.Duration == 0 {
		o.Duration = 30 * time.Second
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "chaos-periodic-")
		if err != nil {
			return nil, err
		}
		o.Dir = d
	}
	p := &periodicRun{o: o, rep: &PeriodicReport{Dir: o.Dir}, led: filepath.Join(o.Dir, "worker.ledger"),
		offsets: []time.Duration{-Skew, 0, Skew}}
	defer p.close()
	if err := p.startServers(); err != nil {
		return nil, err
	}
	if err := p.startProcesses(); err != nil {
		return nil, err
	}
	if err := p.waitForEntry(); err != nil {
		return nil, err
	}
	if err := p.killWindow(ctx); err != nil {
		return nil, err
	}
	if o.Outage > 0 {
		if err := p.outage(ctx); err != nil {
			return nil, err
		}
	}
	s, err := schedule.Parse(schedule.Spec{Every: time.Second})
	if err != nil {
		return nil, err
	}
	firings, byID, err := p.waitForRuns(s)
	if err != nil {
		return nil, err
	}
	p.judgeWindow(firings, byID)
	if !p.rep.Restart.IsZero() {
		p.judgeOutage(s, byID)
	}
	p.stopProcesses()
	p.verdict(ctx)
	return p.rep, nil
}

// periodicNamespace is the periodic scenario's namespace.
const periodicNamespace = "chaosp"

// periodicRun is one run of the periodic scenario: its servers, its
// processes and what it found.
type periodicRun struct {
	o   PeriodicOptions
	rep *PeriodicReport
	led string // the worker's ledger

	srvs   []*redisServer // lane 0's first
	lanes  []string       // their addresses
	common []string       // every process's flags
	admin  redis.Conn     // lane 0's server

	mu     sync.Mutex
	procs  []*exec.Cmd
	exited []chan struct{} // closed when procs[i] has exited

	offsets []time.Duration // the schedulers' clock offsets
	scheds  []*exec.Cmd     // the schedulers' current processes
	inc     int             // the schedulers' incarnations: each restart takes the next (its seed)
	// restartSettled is when the scheduler restarted after the outage
	// has run its first pass: firings from then on all run.
	restartSettled time.Time
}

func (p *periodicRun) logf(format string, args ...any) {
	if p.o.Log != nil {
		fmt.Fprintf(p.o.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

// close kills what is still running and stops the servers.
func (p *periodicRun) close() {
	if p.admin != nil {
		p.admin.Close()
	}
	p.mu.Lock()
	for _, c := range p.procs {
		_ = c.Process.Signal(syscall.SIGKILL)
	}
	p.mu.Unlock()
	for i := len(p.srvs) - 1; i >= 0; i-- {
		p.srvs[i].Stop(syscall.SIGTERM)
	}
}

// key is the namespace's Redis key of s.
func (p *periodicRun) key(s string) string { return "{" + periodicNamespace + "}:" + s }

// startServers starts a redis-server per lane, and names them in every
// process's flags.
func (p *periodicRun) startServers() error {
	bin, err := findRedisServer()
	if err != nil {
		return err
	}
	for k := range max(p.o.Shards, 1) {
		dir := filepath.Join(p.o.Dir, "redis")
		if k > 0 {
			dir = filepath.Join(p.o.Dir, fmt.Sprintf("redis-%d", k))
		}
		srv, err := startRedis(bin, dir, redisOptions{})
		if err != nil {
			return err
		}
		p.srvs = append(p.srvs, srv)
		p.lanes = append(p.lanes, srv.Addr)
	}
	p.common = []string{"-addr", p.lanes[0], "-ns", periodicNamespace}
	if p.o.Shards > 1 {
		p.common = append(p.common, "-addrs", strings.Join(p.lanes, ","))
	}
	return nil
}

// start starts a chaosproc process of args, logging to name.log.
func (p *periodicRun) start(name string, args ...string) (*exec.Cmd, error) {
	lf, err := os.OpenFile(filepath.Join(p.o.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(p.o.Bin, append(append([]string{}, p.common...), args...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); lf.Close(); close(done) }()
	p.mu.Lock()
	p.procs = append(p.procs, cmd)
	p.exited = append(p.exited, done)
	p.mu.Unlock()
	return cmd, nil
}

// startSched starts incarnation inc of scheduler i.
func (p *periodicRun) startSched(i, inc int) error {
	c, err := p.start(fmt.Sprintf("scheduler-%d", i), "-mode", "scheduler", "-entry", periodicEntry,
		"-every", "1s", "-offset", p.offsets[i].String(), "-seed", fmt.Sprint(p.o.Seed+uint64(inc)))
	p.scheds[i] = c
	return err
}

// startProcesses starts the dispatcher, the reaper, the worker and the
// three schedulers.
func (p *periodicRun) startProcesses() error {
	for _, a := range [][]string{{"-mode", "dispatcher"}, {"-mode", "reaper"},
		{"-mode", "worker", "-ledger", p.led, "-sleep-max", "50ms"}} {
		if _, err := p.start(a[1], a...); err != nil {
			return err
		}
	}
	p.scheds = make([]*exec.Cmd, len(p.offsets))
	for i := range p.offsets {
		if err := p.startSched(i, i); err != nil {
			return err
		}
	}
	p.inc = len(p.offsets)
	return nil
}

// waitForEntry waits (up to 15 s) for the schedulers' first pass to
// create the entry: the window starts then.
func (p *periodicRun) waitForEntry() error {
	admin, err := p.srvs[0].Admin()
	if err != nil {
		return err
	}
	p.admin = admin
	deadline := time.Now().Add(15 * time.Second)
	for {
		n, err := redis.Int(p.admin.Do("EXISTS", p.key("pe:"+periodicEntry)))
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: the periodic entry was not created within 15 s (logs in %s)", p.o.Dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.rep.Window[0] = time.Now()
	return nil
}

// killWindow SIGKILLs a random scheduler every 0-1.4 s for the window
// (Duration), restarting it after 0-1 s.
func (p *periodicRun) killWindow(ctx context.Context) error {
	rep := p.rep
	p.logf("periodic window starts; killing schedulers for %v", p.o.Duration)
	rng := rand.New(rand.NewPCG(p.o.Seed, 0x5eed))
	end := rep.Window[0].Add(p.o.Duration)
	for time.Now().Before(end) {
		gap := time.Duration(rng.Int64N(int64(1400 * time.Millisecond)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(gap):
		}
		i := rng.IntN(len(p.offsets))
		_ = p.scheds[i].Process.Signal(syscall.SIGKILL)
		rep.Kills++
		down := time.Duration(rng.Int64N(int64(time.Second)))
		time.Sleep(down)
		p.inc++
		if err := p.startSched(i, p.inc); err != nil {
			return err
		}
	}
	rep.Window[1] = time.Now()
	p.logf("window ends after %d kills; draining", rep.Kills)
	return nil
}

// outage stops every scheduler for Outage, reading the watermark they
// left, and restarts one (the real clock's).
func (p *periodicRun) outage(ctx context.Context) error {
	rep := p.rep
	for _, c := range p.scheds {
		_ = c.Process.Signal(syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	w, err := redis.Int64(p.admin.Do("HGET", p.key("pe:"+periodicEntry), "last"))
	if err != nil {
		return fmt.Errorf("chaos: reading the watermark: %w", err)
	}
	rep.OutageFrom = time.UnixMilli(w)
	p.logf("every scheduler down (watermark %s) for %v", rep.OutageFrom.Format("15:04:05.000"), p.o.Outage)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(p.o.Outage):
	}
	rep.Restart = time.Now()
	if err := p.startSched(1, p.inc+1); err != nil {
		return err
	}
	// Its first pass runs within a second or so; firings after
	// restartSettled are upcoming for it and all run.
	p.restartSettled = rep.Restart.Add(3 * time.Second)
	time.Sleep(4 * time.Second)
	return nil
}

// waitForRuns waits (up to 15 s) for the worker to have run every firing
// of the window (and, after an outage, those from restartSettled on),
// and returns the window's judged firings and the worker's runs by task
// id.
func (p *periodicRun) waitForRuns(s *schedule.Schedule) ([]time.Time, map[string][]*ledger.Run, error) {
	rep := p.rep
	// The firings of the first MaxSkew (2 s) after the entry was created
	// are not judged: a creator whose clock runs ahead puts the firings
	// between the real time and its own below the watermark (see "Periodic
	// entries" in docs/design.md).
	firings := s.Between(rep.Window[0].Add(creationSkew), rep.Window[1], 1<<20)
	rep.Firings = len(firings)
	// After an outage, every firing from restartSettled on must run too.
	var after []time.Time
	if !p.restartSettled.IsZero() {
		after = s.Between(p.restartSettled, p.restartSettled.Add(time.Second), 10)
	}
	waitFor := append(append([]time.Time{}, firings...), after...)
	var runs []*ledger.Run
	var err error
	drainBy := time.Now().Add(15 * time.Second)
	for {
		runs, err = ledger.ReadHandler(p.led)
		if err != nil && !os.IsNotExist(err) {
			return nil, nil, err
		}
		ran := map[string]bool{}
		for _, r := range runs {
			ran[r.ID] = true
		}
		missing := 0
		for _, f := range waitFor {
			if !ran[schedule.FiringID(periodicEntry, f)] {
				missing++
			}
		}
		if missing == 0 || time.Now().After(drainBy) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	byID := map[string][]*ledger.Run{}
	for _, r := range runs {
		byID[r.ID] = append(byID[r.ID], r)
	}
	return firings, byID, nil
}

// judgeWindow checks that every firing of the window ran once, none
// before its time, with the firing time as its Due.
func (p *periodicRun) judgeWindow(firings []time.Time, byID map[string][]*ledger.Run) {
	rep := p.rep
	for _, f := range firings {
		id := schedule.FiringID(periodicEntry, f)
		rs := byID[id]
		switch {
		case len(rs) == 0:
			rep.Missing = append(rep.Missing, id)
			continue
		case len(rs) > 1:
			rep.Duplicate = append(rep.Duplicate, id)
		}
		rep.Ran++
		for _, r := range rs {
			if r.Start < f.UnixMilli() || r.Due != f.UnixMilli() {
				rep.Early = append(rep.Early, fmt.Sprintf("%s started %d due %d", id, r.Start, r.Due))
			}
		}
	}
}

// judgeOutage checks the missed policy "once" after the outage: the
// firings in (watermark, restart - 1s] were all missed and none of them
// runs but the latest (at most 1 s before the restarted process's first
// pass), and every firing after it runs.
func (p *periodicRun) judgeOutage(s *schedule.Schedule, byID map[string][]*ledger.Run) {
	rep := p.rep
	outage := s.Between(rep.OutageFrom, p.restartSettled.Add(time.Second), 1<<20)
	first := -1
	for i, f := range outage {
		ran := len(byID[schedule.FiringID(periodicEntry, f)]) > 0
		if f.Before(rep.Restart.Add(-time.Second)) {
			rep.OutageSkipped++
			if ran {
				rep.Failures = append(rep.Failures, fmt.Sprintf("missed firing %s ran (policy once runs only the latest)", f.Format("15:04:05")))
			}
		}
		if ran && first < 0 {
			first = i
			rep.FirstRun = f
		}
		if first >= 0 && !ran {
			rep.Failures = append(rep.Failures, fmt.Sprintf("firing %s after the restart did not run", f.Format("15:04:05")))
		}
	}
	switch {
	case first < 0:
		rep.Failures = append(rep.Failures, "no firing ran after the outage")
	case rep.FirstRun.After(rep.Restart.Add(2 * time.Second)):
		rep.Failures = append(rep.Failures, fmt.Sprintf("the latest missed firing did not run: the first run after the outage is the firing at %s, restart at %s",
			rep.FirstRun.Format("15:04:05.000"), rep.Restart.Format("15:04:05.000")))
	}
	if rep.OutageSkipped == 0 {
		rep.Failures = append(rep.Failures, "the outage missed no firing")
	}
}

// stopProcesses stops every process (SIGTERM; SIGKILL after 15 s) and
// waits for each: the namespace check reads the gauges once they have
// stopped, as schedulers enqueue and the dispatcher moves up to the end,
// so a count taken while they run can see a bucket and a gauge of two
// different moments.
func (p *periodicRun) stopProcesses() {
	p.mu.Lock()
	running, waits := append([]*exec.Cmd(nil), p.procs...), append([]chan struct{}(nil), p.exited...)
	p.mu.Unlock()
	for _, c := range running {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for i, done := range waits {
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = running[i].Process.Signal(syscall.SIGKILL)
			<-done
		}
	}
}

// verdict runs the namespace check (every gauge matches the structures)
// and turns what the run found into failures: too few firings judged,
// missing, duplicate and early firings, the check's findings and an
// error logged by any process.
func (p *periodicRun) verdict(ctx context.Context) {
	o, rep := p.o, p.rep
	rep.Check = checkPeriodicNamespace(ctx, periodicNamespace, p.lanes)
	if judged := o.Duration - creationSkew; rep.Firings < int(judged/time.Second)-1 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("only %d firings judged in a window of %v (%v after creation)", rep.Firings, o.Duration, judged))
	}
	for what, ids := range map[string][]string{"missing": rep.Missing, "run more than once": rep.Duplicate, "early or wrong Due": rep.Early} {
		if len(ids) > 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%d firings %s: %s", len(ids), what, strings.Join(ids[:min(len(ids), 5)], ", ")))
		}
	}
	rep.Failures = append(rep.Failures, rep.Check...)
	for _, name := range []string{"dispatcher", "reaper", "worker", "scheduler-0", "scheduler-1", "scheduler-2"} {
		if b, err := os.ReadFile(filepath.Join(o.Dir, name+".log")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, `"level":"ERROR"`) {
					rep.Failures = append(rep.Failures, name+" logged an error: "+l)
					break
				}
			}
		}
	}
}

// checkPeriodicNamespace runs the engine's consistency check over the
// lanes at addrs once every process has stopped, and returns a line per
// finding.
func checkPeriodicNamespace(ctx context.Context, ns string, addrs []string) []string {
	var pools []*redis.Pool
	for _, a := range addrs {
		p := clientPool(a)
		defer p.Close()
		pools = append(pools, p)
	}
	c, err := engine.NewInspector(engine.Config{Namespace: ns, Logger: quietLogger()}, pools...)
	if err != nil {
		return []string{fmt.Sprintf("namespace check: %v", err)}
	}
	return checkWorkflowNamespace(ctx, c)
}
