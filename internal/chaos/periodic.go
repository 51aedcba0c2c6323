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
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
		}
	}
	bin, err := findRedisServer()
	if err != nil {
		return nil, err
	}
	srv, err := startRedis(bin, filepath.Join(o.Dir, "redis"), redisOptions{})
	if err != nil {
		return nil, err
	}
	defer srv.Stop(syscall.SIGTERM)
	rep := &PeriodicReport{Dir: o.Dir}
	const ns = "chaosp"
	common := []string{"-addr", srv.Addr, "-ns", ns}
	lanes := []string{srv.Addr}
	if o.Shards > 1 {
		for k := 1; k < o.Shards; k++ {
			other, err := startRedis(bin, filepath.Join(o.Dir, fmt.Sprintf("redis-%d", k)), redisOptions{})
			if err != nil {
				return nil, err
			}
			defer other.Stop(syscall.SIGTERM)
			lanes = append(lanes, other.Addr)
		}
		common = append(common, "-addrs", strings.Join(lanes, ","))
	}
	var mu sync.Mutex
	var procs []*exec.Cmd
	var exited []chan struct{} // closed when procs[i] has exited
	start := func(name string, args ...string) (*exec.Cmd, error) {
		lf, err := os.OpenFile(filepath.Join(o.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(o.Bin, append(append([]string{}, common...), args...)...)
		cmd.Stdout, cmd.Stderr = lf, lf
		if err := cmd.Start(); err != nil {
			lf.Close()
			return nil, err
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); lf.Close(); close(done) }()
		mu.Lock()
		procs = append(procs, cmd)
		exited = append(exited, done)
		mu.Unlock()
		return cmd, nil
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range procs {
			_ = c.Process.Signal(syscall.SIGKILL)
		}
	}()
	led := filepath.Join(o.Dir, "worker.ledger")
	for _, a := range [][]string{{"-mode", "dispatcher"}, {"-mode", "reaper"},
		{"-mode", "worker", "-ledger", led, "-sleep-max", "50ms"}} {
		if _, err := start(a[1], a...); err != nil {
			return nil, err
		}
	}
	offsets := []time.Duration{-Skew, 0, Skew}
	scheds := make([]*exec.Cmd, len(offsets))
	startSched := func(i, inc int) error {
		c, err := start(fmt.Sprintf("scheduler-%d", i), "-mode", "scheduler", "-entry", periodicEntry,
			"-every", "1s", "-offset", offsets[i].String(), "-seed", fmt.Sprint(o.Seed+uint64(inc)))
		scheds[i] = c
		return err
	}
	for i := range offsets {
		if err := startSched(i, i); err != nil {
			return nil, err
		}
	}
	// The window starts once the entry exists (the first pass ran).
	admin, err := srv.Admin()
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	key := func(s string) string { return "{" + ns + "}:" + s }
	deadline := time.Now().Add(15 * time.Second)
	for {
		n, err := redis.Int(admin.Do("EXISTS", key("pe:"+periodicEntry)))
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("chaos: the periodic entry was not created within 15 s (logs in %s)", o.Dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rep.Window[0] = time.Now()
	logf("periodic window starts; killing schedulers for %v", o.Duration)
	rng := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	inc := len(offsets)
	end := rep.Window[0].Add(o.Duration)
	for time.Now().Before(end) {
		gap := time.Duration(rng.Int64N(int64(1400 * time.Millisecond)))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(gap):
		}
		i := rng.IntN(len(offsets))
		_ = scheds[i].Process.Signal(syscall.SIGKILL)
		rep.Kills++
		down := time.Duration(rng.Int64N(int64(time.Second)))
		time.Sleep(down)
		inc++
		if err := startSched(i, inc); err != nil {
			return nil, err
		}
	}
	rep.Window[1] = time.Now()
	logf("window ends after %d kills; draining", rep.Kills)
	var restartSettled time.Time
	if o.Outage > 0 {
		for _, c := range scheds {
			_ = c.Process.Signal(syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
		w, err := redis.Int64(admin.Do("HGET", key("pe:"+periodicEntry), "last"))
		if err != nil {
			return nil, fmt.Errorf("chaos: reading the watermark: %w", err)
		}
		rep.OutageFrom = time.UnixMilli(w)
		logf("every scheduler down (watermark %s) for %v", rep.OutageFrom.Format("15:04:05.000"), o.Outage)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(o.Outage):
		}
		rep.Restart = time.Now()
		if err := startSched(1, inc+1); err != nil {
			return nil, err
		}
		// Its first pass runs within a second or so; firings after
		// restartSettled are upcoming for it and all run.
		restartSettled = rep.Restart.Add(3 * time.Second)
		time.Sleep(4 * time.Second)
	}
	// Every firing of the window is due by now; wait for the worker to
	// have run each (the dispatcher makes them ready at their time).
	s, err := schedule.Parse(schedule.Spec{Every: time.Second})
	if err != nil {
		return nil, err
	}
	// The firings of the first MaxSkew (2 s) after the entry was created
	// are not judged: a creator whose clock runs ahead puts the firings
	// between the real time and its own below the watermark (see "Periodic
	// entries" in docs/design.md).
	firings := s.Between(rep.Window[0].Add(creationSkew), rep.Window[1], 1<<20)
	rep.Firings = len(firings)
	// After an outage, every firing from restartSettled on must run too.
	var after []time.Time
	if !restartSettled.IsZero() {
		after = s.Between(restartSettled, restartSettled.Add(time.Second), 10)
	}
	waitFor := append(append([]time.Time{}, firings...), after...)
	var runs []*ledger.Run
	drainBy := time.Now().Add(15 * time.Second)
	for {
		runs, err = ledger.ReadHandler(led)
		if err != nil && !os.IsNotExist(err) {
			return nil, err
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
	if !rep.Restart.IsZero() {
		// Firings in (watermark, restart - 1s] were all missed: "once"
		// runs none of them; the latest missed firing (at most 1 s
		// before the restarted process's first pass) runs, and every
		// firing after it.
		outage := s.Between(rep.OutageFrom, restartSettled.Add(time.Second), 1<<20)
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
	// Every gauge matches the structures, read once every process has
	// stopped: schedulers enqueue and the dispatcher moves up to the end,
	// so a count taken while they run can see a bucket and a gauge of two
	// different moments.
	mu.Lock()
	running, waits := append([]*exec.Cmd(nil), procs...), append([]chan struct{}(nil), exited...)
	mu.Unlock()
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
	rep.Check = checkPeriodicNamespace(ctx, ns, lanes)
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
	return rep, nil
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
