package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Roles of the engine's processes.
const (
	roleProducer   = "producer"
	roleDispatcher = "dispatcher"
	roleWorker     = "worker"
	roleReaper     = "reaper"
)

// BuildProc builds the chaosproc binary into dir and returns its path. race
// builds it with the race detector.
func BuildProc(ctx context.Context, dir string, race bool) (string, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	out := filepath.Join(dir, "chaosproc")
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "github.com/bucketq/bucketq/internal/chaos/cmd/chaosproc")
	cmd := exec.CommandContext(ctx, gobin, args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("chaos: go build chaosproc: %v\n%s", err, b)
	}
	return out, nil
}

// proc is one incarnation of one process slot.
type proc struct {
	Role       string
	Slot, Inc  int
	Name       string
	Offset     time.Duration
	LogPath    string
	LedgerPath string
	IDPath     string
	PID        int
	Started    time.Time

	cmd      *exec.Cmd
	done     chan struct{}
	exitCode int
	exited   time.Time
	sig      atomic.Int32 // the signal the harness sent, if any
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// workerID reads the id the worker wrote at start ("" if none yet); on
// shards, its id in lane 0.
func (p *proc) workerID() string {
	if ids := p.workerIDs(); len(ids) > 0 {
		return ids[0]
	}
	return ""
}

// workerIDs reads the worker's ids, one per lane.
func (p *proc) workerIDs() []string {
	if p.IDPath == "" {
		return nil
	}
	b, err := os.ReadFile(p.IDPath)
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// slot is a process the harness keeps running: incarnation after
// incarnation.
type slot struct {
	Role   string
	Index  int
	Offset time.Duration
	Target int // producers: tasks to have acknowledged over all incarnations

	mu    sync.Mutex
	cur   *proc
	all   []*proc
	inc   int
	done  bool // producers: target reached
	doneC chan struct{}
}

func (s *slot) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// crash is a process that exited without being told to.
type crash struct {
	Name     string
	PID      int
	ExitCode int
	LogPath  string
	Tail     string
}

// logScan is what the harness finds in a process's JSON log.
type logScan struct {
	LeaseLost []string // task ids whose result was dropped: recovered elsewhere
	Expired   []string // task ids given up by the worker's own lease timer
	// Wedged counts, per task id, retries to record a result that failed
	// with an error no retry can fix (record gone or malformed).
	Wedged    map[string]int
	WedgedErr map[string]string
	// Unrecorded lists task ids whose result failed to be recorded at
	// least once (Redis down, a cut): if the process is killed before a
	// retry succeeds, the run's lease is still held, and the task rightly
	// runs again.
	Unrecorded map[string]bool
	Errors     int
	Warnings   int
	Panics     int
	Violations int
	Messages   map[string]int // error-level messages by text
	// Reaped lists the worker ids a reaper found dead and returned tasks
	// of (its "worker died; its tasks were returned" lines).
	Reaped []string
}

func scanLog(path string) logScan {
	ls := logScan{Wedged: map[string]int{}, WedgedErr: map[string]string{}, Messages: map[string]int{}, Unrecorded: map[string]bool{}}
	f, err := os.Open(path)
	if err != nil {
		return ls
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("{")) {
			if bytes.Contains(line, []byte("panic")) || bytes.Contains(line, []byte("fatal error")) ||
				bytes.Contains(line, []byte("DATA RACE")) {
				ls.Panics++
			}
			continue
		}
		var m struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Task  string `json:"task_id"`
			Err   any    `json:"err"`
			// A reaper's recovery of a dead worker's tasks.
			Worker    string `json:"worker"`
			Recovered int    `json:"recovered"`
		}
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		switch m.Level {
		case "ERROR":
			ls.Errors++
			msg := m.Msg
			if msg == "chaosproc failed" {
				// A process's own failure: what failed matters.
				msg += ": " + truncLine(fmt.Sprint(m.Err))
			}
			ls.Messages[msg]++
		case "WARN":
			ls.Warnings++
		}
		switch {
		case strings.HasPrefix(m.Msg, "task was recovered elsewhere"),
			strings.HasPrefix(m.Msg, "could not record a task's result before its lease ended"):
			ls.LeaseLost = append(ls.LeaseLost, m.Task)
		case strings.HasPrefix(m.Msg, "task ran past its timeout and lease"):
			ls.Expired = append(ls.Expired, m.Task)
		case m.Msg == "redis24 violation":
			ls.Violations++
		case m.Msg == "worker died; its tasks were returned" && m.Recovered > 0:
			ls.Reaped = append(ls.Reaped, m.Worker)
		case strings.HasPrefix(m.Msg, "record result failed"):
			e := fmt.Sprint(m.Err)
			if m.Task != "" {
				ls.Unrecorded[m.Task] = true
			} else if f := strings.Fields(strings.TrimPrefix(e, "buckets: finish ")); len(f) > 0 {
				ls.Unrecorded[strings.TrimSuffix(f[0], ":")] = true
			}
			if permanentErr(e) {
				if f := strings.Fields(strings.TrimPrefix(e, "buckets: finish ")); len(f) > 0 {
					id := strings.TrimSuffix(f[0], ":")
					ls.Wedged[id]++
					ls.WedgedErr[id] = e
				}
			}
		}
	}
	return ls
}

// start launches a new incarnation of s; count is a producer's number of
// tasks to enqueue.
func (h *harness) start(s *slot, count int) (*proc, error) {
	s.mu.Lock()
	s.inc++
	inc := s.inc
	s.mu.Unlock()
	name := fmt.Sprintf("%s-%d.%d", s.Role, s.Index, inc)
	p := &proc{Role: s.Role, Slot: s.Index, Inc: inc, Name: name, Offset: s.Offset,
		LogPath: filepath.Join(h.dir, "logs", name+".log"), done: make(chan struct{})}
	args := []string{"-mode", s.Role, "-addr", h.procAddr, "-ns", h.ns,
		"-offset", s.Offset.String(), "-seed", fmt.Sprint(h.seedFor(name))}
	if h.laneAddrs != "" {
		args = append(args, "-addrs", h.laneAddrs)
	}
	args = append(args, h.procArgs...)
	switch s.Role {
	case roleProducer, roleWorker:
		p.LedgerPath = filepath.Join(h.dir, "ledgers", name+".ledger")
		args = append(args, "-ledger", p.LedgerPath)
	}
	if s.Role == roleWorker {
		p.IDPath = filepath.Join(h.dir, "ids", name+".id")
		args = append(args, "-idfile", p.IDPath)
	}
	if s.Role == roleProducer {
		args = append(args, h.producerArgs(s, inc, count)...)
	}
	if s.Role == roleWorker {
		args = append(args, h.workerArgs...)
	}
	args = append(args, h.sc.SlotArgs[fmt.Sprintf("%s-%d", s.Role, s.Index)]...)
	args = append(args, h.opts.ProcArgs...) // last: they win
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(h.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	setProcAttr(cmd)
	// Start and register under h.mu, so that stopAll either sees the new
	// process or keeps it from starting.
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopping {
		return nil, errStopping
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: start %s: %w", name, err)
	}
	p.cmd, p.PID, p.Started = cmd, cmd.Process.Pid, time.Now()
	s.mu.Lock()
	s.cur = p
	s.all = append(s.all, p)
	s.mu.Unlock()
	h.procs = append(h.procs, p)
	go h.watch(s, p)
	return p, nil
}

var errStopping = errors.New("chaos: the run is stopping")

// watch waits for p to exit and records an exit nobody asked for.
func (h *harness) watch(s *slot, p *proc) {
	err := p.cmd.Wait()
	p.exitCode = 0
	if ee, ok := err.(*exec.ExitError); ok {
		p.exitCode = ee.ExitCode()
	} else if err != nil {
		p.exitCode = -1
	}
	p.exited = time.Now()
	close(p.done)
	if p.sig.Load() != 0 {
		return
	}
	if p.Role == roleProducer && p.exitCode == 0 {
		h.producerDone(s)
		return
	}
	if p.Role == roleProducer && selfKilled(p) {
		h.mu.Lock()
		h.kills = append(h.kills, &killEvent{Role: p.Role, Name: p.Name, PID: p.PID, Signal: syscall.SIGKILL, At: p.exited, Self: true})
		h.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		h.restart(s)
		return
	}
	h.mu.Lock()
	h.crashes = append(h.crashes, crash{Name: p.Name, PID: p.PID, ExitCode: p.exitCode, LogPath: p.LogPath})
	stopping := h.stopping
	h.mu.Unlock()
	h.logf("UNEXPECTED EXIT of %s (pid %d, code %d); log %s", p.Name, p.PID, p.exitCode, p.LogPath)
	if !stopping {
		time.Sleep(200 * time.Millisecond)
		h.restart(s)
	}
}

// signal sends sig to p and waits for it to exit (SIGKILL after 20 s).
func (h *harness) signal(p *proc, sig syscall.Signal) {
	p.sig.Store(int32(sig))
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		h.logf("%s did not exit 20 s after %v; killing it", p.Name, sig)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// restart starts the next incarnation of s, unless the run is stopping or
// a producer slot has reached its target.
func (h *harness) restart(s *slot) {
	h.mu.Lock()
	stopping := h.stopping
	h.mu.Unlock()
	if stopping {
		return
	}
	left := 0
	if s.Role == roleProducer {
		left = s.Target - h.ackedBy(s)
		if left <= 0 {
			h.producerDone(s)
			return
		}
	}
	if _, err := h.start(s, left); err != nil && !errors.Is(err, errStopping) {
		h.logf("restart %s-%d: %v", s.Role, s.Index, err)
	}
}

func (h *harness) producerDone(s *slot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.done = true
		close(s.doneC)
	}
}

// ackedBy counts the tasks slot s's producers have acknowledged.
func (h *harness) ackedBy(s *slot) int {
	s.mu.Lock()
	ps := append([]*proc(nil), s.all...)
	s.mu.Unlock()
	n := 0
	for _, p := range ps {
		b, err := os.ReadFile(p.LedgerPath)
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			b = b[:i+1]
		}
		n += bytes.Count(b, []byte("\nA ")) + btoi(bytes.HasPrefix(b, []byte("A ")))
	}
	return n
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// selfKilled reports whether a producer died by the SIGKILL it armed
// itself (an X line in its ledger) in the middle of a call.
func selfKilled(p *proc) bool {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return false
	}
	b, err := os.ReadFile(p.LedgerPath)
	return err == nil && (bytes.Contains(b, []byte("\nX ")) || bytes.HasPrefix(b, []byte("X ")))
}

// permanentErr reports whether an error from recording a result is one no
// retry can fix: the task's record is gone or malformed.
func permanentErr(e string) bool {
	return strings.Contains(e, "not found") || strings.Contains(e, "malformed") || strings.Contains(e, "not a task record")
}
