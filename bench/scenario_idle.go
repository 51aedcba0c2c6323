package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// idleCases measure what an implementation costs with nothing to do:
// 1 dispatcher + Sizes.IdleWorkers workers consuming an empty namespace
// (for the engine: one Server with every role, i.e. dispatcher, reaper and
// a worker with that many slots, in one process).
//
// The window is Sizes.IdleDuration, or Sizes.IdlePeriods (3 unless
// -idle-periods says otherwise) times the implementation's longest idle
// period if it says (Idler) and that is longer: for the engine
// at its defaults, 3 x the 30 s reap interval, so that the idle wait (20 s),
// the heartbeat (10 s) and the reap all fire several times inside it.
//
// The implementation runs in a child process (this same binary, re-executed
// with BQBENCH_CHILD=idle), so that its CPU time is not mixed with the
// harness's or with goroutines left over from earlier measurements. The
// child reports its own getrusage (user+sys) when asked, at the start and
// at the end of the window; the parent reads INFO commandstats and INFO cpu
// around the same window, after a 1s warm-up, and runs MONITOR meanwhile.
// Reported, per second of the window:
//
//   - commands: commands Redis executed (commandstats deltas, INFO left
//     out); commands run inside Lua scripts count here, one each;
//   - client_commands: commands clients sent (MONITOR lines not marked
//     "lua", INFO left out): an EVALSHA counts once, a pipeline of five
//     commands five times;
//   - round_trips: waits for replies counted by the implementation's own
//     connections (RoundTripCounter; n/a otherwise): a pipeline counts once;
//   - client_cpu and redis_cpu: CPU time of the child and of redis-server,
//     as % of one core.
//
// On a shared server (-redis) other clients' commands are counted too.
//
// The case is Concurrent: when the harness starts its servers, every
// implementation's and run's measurement goes on at once, each with its
// own child and its own redis-server (INFO commandstats and cpu are per
// server), so the scenario takes about one window; with -redis they run
// one after another, each in its own namespace.
func idleCases(s Sizes) []*Case {
	return []*Case{{
		Scenario: "idle",
		Title: fmt.Sprintf("at least %s and %dx the longest idle period, 1 dispatcher + %d workers (engine: dispatcher + reaper + %d-slot worker), one child process",
			s.IdleDuration, s.IdlePeriods, s.IdleWorkers, s.IdleWorkers),
		Params: map[string]any{"min_seconds": s.IdleDuration.Seconds(), "workers": s.IdleWorkers, "dispatchers": 1,
			"child_process": true},
		Metrics: []MetricDef{
			{Key: "commands", Unit: "cmds/s"}, {Key: "client_commands", Unit: "cmds/s"},
			{Key: "round_trips", Unit: "/s"},
			{Key: "client_cpu", Unit: "%"}, {Key: "redis_cpu", Unit: "%"},
		},
		NoOpen:     true,
		Concurrent: true,
		Needs:      needScheduler,
		Timeout:    s.IdleDuration + 5*time.Minute,
		Run: func(ctx context.Context, m *Measure) (map[string]float64, error) {
			return runIdle(ctx, m, s.IdleDuration, s.IdlePeriods, s.IdleWorkers)
		},
	}}
}

// Environment variables of the idle child.
const (
	envChild       = "BQBENCH_CHILD"
	envChildImpl   = "BQBENCH_IMPL"
	envChildAddr   = "BQBENCH_ADDR"
	envChildNS     = "BQBENCH_NS"
	envChildPoll   = "BQBENCH_POLL"
	envChildWork   = "BQBENCH_WORKERS"
	envChildDisp   = "BQBENCH_DISPATCHERS"
	envChildShared = "BQBENCH_SHARED"
)

// child is the parent's view of the idle child process.
type child struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// request writes a line and waits for the reply line.
func (c *child) request(line string, timeout time.Duration) (string, error) {
	if line != "" {
		if _, err := io.WriteString(c.in, line+"\n"); err != nil {
			return "", err
		}
	}
	select {
	case l, ok := <-c.lines:
		if !ok {
			return "", errors.New("idle child exited")
		}
		return l, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("idle child: no reply to %q within %s", line, timeout)
	}
}

// mark is what the child reports at one end of the window.
type mark struct {
	cpu        float64 // CPU time so far, seconds
	roundTrips int64   // -1: not counted
	at         time.Time
}

// mark asks the child for its CPU time and round trips so far.
func (c *child) mark() (mark, error) {
	l, err := c.request("mark", 10*time.Second)
	if err != nil {
		return mark{}, err
	}
	m := mark{at: time.Now()}
	f := strings.Fields(l)
	if len(f) != 4 || f[0] != "cpu" {
		return m, fmt.Errorf("idle child: unexpected reply %q", l)
	}
	u, err1 := strconv.ParseInt(f[1], 10, 64)
	s, err2 := strconv.ParseInt(f[2], 10, 64)
	rt, err3 := strconv.ParseInt(f[3], 10, 64)
	m.cpu, m.roundTrips = float64(u+s)/1e6, rt
	return m, errors.Join(err1, err2, err3)
}

// runIdle performs one idle measurement.
func runIdle(ctx context.Context, m *Measure, window time.Duration, periods, workers int) (map[string]float64, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(),
		envChild+"=idle",
		envChildImpl+"="+m.Impl.Name(),
		envChildAddr+"="+m.Env.Addr,
		envChildNS+"="+m.Env.Namespace,
		envChildPoll+"="+m.Env.Poll.String(),
		envChildWork+"="+strconv.Itoa(workers),
		envChildDisp+"=1",
		envChildShared+"="+strconv.FormatBool(!m.Own),
	)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = childProcAttr()
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, in: in, lines: make(chan string, 4)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	exited := false
	defer func() {
		if exited {
			return
		}
		in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()

	l, err := c.request("", 60*time.Second)
	if err != nil {
		return nil, err
	}
	switch {
	case strings.HasPrefix(l, "skip "):
		why := strings.TrimPrefix(l, "skip ")
		if strings.Contains(why, ErrNotImplemented.Error()) {
			return nil, fmt.Errorf("%s: %w", why, ErrNotImplemented)
		}
		return nil, fmt.Errorf("%s: %w", why, ErrUnsupported)
	case strings.HasPrefix(l, "ready "):
		longest, err := time.ParseDuration(strings.TrimPrefix(l, "ready "))
		if err != nil {
			return nil, fmt.Errorf("idle child: %s: %w", l, err)
		}
		window = max(window, time.Duration(periods)*longest)
		m.Detail("longest_idle_period_seconds", longest.Seconds())
	default:
		return nil, fmt.Errorf("idle child: %s", l)
	}
	m.Detail("window_seconds", window.Seconds())
	m.Progress("idle: measuring for %s", window)
	mon, err := StartMonitor(m.Env.Addr)
	if err != nil {
		return nil, err
	}
	monStopped := false
	defer func() {
		if !monStopped {
			_ = mon.Stop()
		}
	}()
	if !sleepCtx(ctx, time.Second) {
		return nil, ctx.Err()
	}
	// Before Redis 2.6 there are no commandstats: MONITOR alone counts.
	cmdA, err := m.Admin.CommandCalls()
	noStats := errors.Is(err, errNoCommandStats)
	if err != nil && !noStats {
		return nil, err
	}
	if len(cmdA) == 0 && !noStats {
		return nil, errors.New("the server has no INFO commandstats (Redis >= 2.6 needed for idle)")
	}
	srvA, err := m.Admin.ServerCPU()
	if err != nil {
		return nil, err
	}
	tA := time.Now()
	mk1, err := c.mark()
	if err != nil {
		return nil, err
	}
	if !sleepCtx(ctx, window) {
		return nil, ctx.Err()
	}
	cmdB, err := m.Admin.CommandCalls()
	if err != nil && !noStats {
		return nil, err
	}
	srvB, err := m.Admin.ServerCPU()
	if err != nil {
		return nil, err
	}
	tB := time.Now()
	mk2, err := c.mark()
	if err != nil {
		return nil, err
	}
	time.Sleep(50 * time.Millisecond) // let MONITOR lines up to tB arrive
	monStopped = true
	if err := mon.Stop(); err != nil {
		return nil, err
	}
	sent, inLua := mon.Counts(tA, tB, "info")
	// Stop the child and check that it ended cleanly.
	in.Close()
	for l := range c.lines {
		if l != "bye" {
			m.Progress("idle child: %s", l)
		}
	}
	exited = true
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("idle child: %w", err)
	}

	secs := tB.Sub(tA).Seconds()
	total := int64(0)
	per := map[string]float64{}
	for name, b := range cmdB {
		if name == "info" {
			continue
		}
		if d := b - cmdA[name]; d > 0 {
			total += d
			per[name] = float64(d) / secs
		}
	}
	rate := func(c map[string]int64) (map[string]float64, float64) {
		out, sum := map[string]float64{}, 0.0
		for k, v := range c {
			out[k] = float64(v) / secs
			sum += out[k]
		}
		return out, sum
	}
	sentPer, sentTotal := rate(sent)
	luaPer, _ := rate(inLua)
	m.Detail("commands_per_second", per)
	m.Detail("client_commands_per_second", sentPer)
	m.Detail("lua_commands_per_second", luaPer)
	m.Detail("top_client_commands", topCommands(sentPer, 5))
	res := map[string]float64{
		"commands":        float64(total) / secs,
		"client_commands": sentTotal,
		"client_cpu":      100 * (mk2.cpu - mk1.cpu) / mk2.at.Sub(mk1.at).Seconds(),
		"redis_cpu":       100 * (srvB - srvA) / secs,
	}
	if noStats {
		delete(res, "commands") // n/a: only MONITOR counted (client_commands)
	}
	if mk1.roundTrips >= 0 {
		// The mark requests themselves travel on the child's stdin, not
		// to Redis: nothing to subtract.
		res["round_trips"] = float64(mk2.roundTrips-mk1.roundTrips) / mk2.at.Sub(mk1.at).Seconds()
	}
	return res, nil
}

// topCommands renders the n most frequent commands, "evalsha 1.6k/s, ...".
func topCommands(per map[string]float64, n int) string {
	type kv struct {
		k string
		v float64
	}
	var all []kv
	for k, v := range per {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	var parts []string
	for i, e := range all {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %s/s", e.k, si(e.v)))
	}
	return strings.Join(parts, ", ")
}

// maybeRunChild runs the idle child and exits if this process is one; it is
// called first thing by main and by TestMain.
func maybeRunChild() {
	if os.Getenv(envChild) != "idle" {
		return
	}
	os.Exit(runIdleChild(os.Stdin, os.Stdout))
}

// runIdleChild opens the implementation named in the environment, starts
// consuming, prints "ready", answers each "mark" line with "cpu <user µs>
// <sys µs>" (its own getrusage) and, at end of input, stops, cleans up and
// prints "bye". An Open error is reported as "skip <why>" or "error <why>".
func runIdleChild(stdin io.Reader, stdout io.Writer) int {
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "idle child: "+format+"\n", args...) }
	poll, _ := time.ParseDuration(os.Getenv(envChildPoll))
	workers, _ := strconv.Atoi(os.Getenv(envChildWork))
	disp, _ := strconv.Atoi(os.Getenv(envChildDisp))
	shared := os.Getenv(envChildShared) == "true"
	env := Env{Addr: os.Getenv(envChildAddr), Namespace: os.Getenv(envChildNS), Poll: poll, Logf: logf}
	impl, err := newImpl(os.Getenv(envChildImpl))
	if err != nil {
		fmt.Fprintf(stdout, "error %v\n", err)
		return 0
	}
	ctx := context.Background()
	if err := impl.Open(ctx, env); err != nil {
		verdict := "error"
		if isSkip(err) {
			verdict = "skip"
		}
		fmt.Fprintf(stdout, "%s %v\n", verdict, err)
		_ = impl.Close()
		return 0
	}
	stop, err := impl.Consume(ctx, ConsumeConfig{Workers: workers, Dispatchers: disp},
		func(context.Context, Delivery) error { return nil })
	if err != nil {
		fmt.Fprintf(stdout, "error consume: %v\n", err)
		_ = impl.Close()
		return 0
	}
	var longest time.Duration
	if id, ok := impl.(Idler); ok {
		for _, d := range id.IdleIntervals() {
			longest = max(longest, d)
		}
	}
	fmt.Fprintf(stdout, "ready %s\n", longest)
	rt := func() int64 {
		if c, ok := impl.(RoundTripCounter); ok {
			return c.RoundTrips()
		}
		return -1
	}
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		if sc.Text() != "mark" {
			continue
		}
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			fmt.Fprintf(stdout, "error getrusage: %v\n", err)
			continue
		}
		fmt.Fprintf(stdout, "cpu %d %d %d\n", ru.Utime.Nano()/1000, ru.Stime.Nano()/1000, rt())
	}
	code := 0
	if err := stop(); err != nil {
		logf("stop: %v", err)
		code = 1
	}
	if shared {
		if cl, ok := impl.(Cleaner); ok {
			if err := cl.Cleanup(ctx); err != nil {
				logf("cleanup: %v", err)
			}
		}
	}
	if err := impl.Close(); err != nil {
		logf("close: %v", err)
		code = 1
	}
	if shared {
		a := NewAdmin(env.Addr)
		if _, err := a.DeleteMatching(impl.KeyPatterns()); err != nil {
			logf("deleting keys: %v", err)
		}
		a.Close()
	}
	fmt.Fprintln(stdout, "bye")
	return code
}
