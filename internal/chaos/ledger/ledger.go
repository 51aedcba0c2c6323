// Package ledger is the on-disk record the chaos processes keep and the
// chaos checker reads: producers write which enqueues were acknowledged,
// handlers write which tasks started and ended, in append-only text files
// with one event per line.
//
// Every line is written with a single write(2) on a file opened with
// O_APPEND, so lines from concurrent goroutines never interleave and a
// process killed with SIGKILL leaves every line it wrote complete (the
// kernel has it; only a machine crash could lose it). A reader ignores a
// last line without its newline.
//
// Producer ledger lines:
//
//	H <pid> <clock_offset_ms>             once, when the process starts
//	B <batch> <n> <t_ms>                  before EnqueueBatch is called
//	A <batch> <i> <id> <due_ms>           per task, after it returned nil
//	F <batch> <error>                     after it returned an error
//	X <batch> <delay_us>                  the producer will SIGKILL itself this
//	                                      long after the call starts
//	G <calls> <execs>                     now and then: the enqueue calls made
//	                                      and the EXECs its connections sent
//
// The A lines of a batch are written together and fsync'd; a producer
// killed before that has written nothing for the batch, which is correct:
// the batch was never acknowledged. Due times are on the producer's clock.
//
// Handler ledger lines:
//
//	S <id> <start_ms> <pid> <payload> <attempt> <recoveries> <due_ms>
//	E <id> <end_ms> <pid>
//
// S is written when the handler is entered, E just before it returns nil.
// Times are Unix milliseconds of the real clock (time.Now), whatever
// clock offset the process runs with; payload is the payload's first
// space-separated word (at most 80 bytes).
package ledger

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Writer appends lines to a ledger file.
type Writer struct {
	mu sync.Mutex
	f  *os.File
}

// Create opens path for appending, creating it if needed.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f}, nil
}

// Write appends the lines (each without its newline) with one write(2).
func (w *Writer) Write(lines ...string) error {
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err := w.f.Write(b.Bytes())
	return err
}

// Sync flushes the file to stable storage.
func (w *Writer) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Sync()
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// PayloadWord is what a handler line records of a payload: its first
// space-separated word, at most 80 bytes, "-" when empty.
func PayloadWord(p []byte) string {
	if i := bytes.IndexByte(p, ' '); i >= 0 {
		p = p[:i]
	}
	if len(p) > 80 {
		p = p[:80]
	}
	s := strings.Map(func(r rune) rune {
		if r <= ' ' || r == 0x7f {
			return '_'
		}
		return r
	}, string(p))
	if s == "" {
		return "-"
	}
	return s
}

// Start formats a handler's S line of r (End and File unused): besides
// the run, the task's flow-control key ("-" for none), when the run was
// claimed (Unix ms, the worker's clock) and when the task expires (0:
// never).
func Start(r Run) string {
	key := r.Key
	if key == "" {
		key = "-"
	}
	return fmt.Sprintf("S %s %d %d %s %d %d %d %s %d %d", r.ID, r.Start, r.PID, r.Payload, r.Attempt, r.Recoveries, r.Due, key, r.Claimed, r.Expires)
}

// End formats a handler's E line.
func End(id string, endMs int64, pid int) string {
	return fmt.Sprintf("E %s %d %d", id, endMs, pid)
}

// Chained formats a worker's C line: the batches it took in the round
// trip of the results before them so far (engine.Worker.Chained).
func Chained(n int64) string { return fmt.Sprintf("C %d", n) }

// Ahead formats a worker's P line: the tasks it claimed ahead of its
// handler slots so far (engine.Worker.ClaimedAhead).
func Ahead(n int64) string { return fmt.Sprintf("P %d", n) }

// Run is one handler run read from a handler ledger.
type Run struct {
	ID         string
	Start      int64 // Unix ms, real clock
	End        int64 // 0 when no E line was found
	PID        int
	Payload    string
	Attempt    int
	Recoveries int
	Due        int64  // the record's due time (producer's clock)
	Key        string // the task's flow-control key ("" for none)
	Claimed    int64  // when the run was claimed (Unix ms, the worker's clock)
	Expires    int64  // when the task expires (Unix ms; 0: never)
	File       string
}

// Acked is one acknowledged task read from a producer ledger.
type Acked struct {
	ID    string
	Batch string
	Index int
	Due   int64 // Unix ms, producer's clock
	PID   int
	// Offset is the producer's clock offset in ms (its clock minus the
	// real one).
	Offset int64
	File   string
}

// Batch is one EnqueueBatch call read from a producer ledger.
type Batch struct {
	ID     string
	N      int
	At     int64 // Unix ms, producer's clock, just before the call
	Acked  bool
	Failed string // the error, if the call returned one
	// SelfKill: the producer armed a SIGKILL of itself for this call.
	SelfKill bool
	PID      int
	Offset   int64
	File     string
}

// Producer is what a producer ledger holds.
type Producer struct {
	PID     int
	Offset  int64
	Batches []*Batch
	Acked   []Acked
	// Calls and Execs are from the last G line: the enqueue calls the
	// producer made and the EXECs its connections sent by then (fewer
	// EXECs than calls: enqueues shared transactions).
	Calls, Execs int64
}

// lines returns the complete lines of path.
func lines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		b = nil
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out, sc.Err()
}

// ReadProducer reads a producer ledger.
func ReadProducer(path string) (*Producer, error) {
	ls, err := lines(path)
	if err != nil {
		return nil, err
	}
	p := &Producer{}
	byID := map[string]*Batch{}
	for n, l := range ls {
		f := strings.SplitN(l, " ", 3)
		bad := func() error { return fmt.Errorf("%s:%d: malformed line %q", path, n+1, l) }
		switch f[0] {
		case "H":
			if len(f) < 3 {
				return nil, bad()
			}
			p.PID, _ = strconv.Atoi(f[1])
			p.Offset, _ = strconv.ParseInt(f[2], 10, 64)
		case "B":
			g := strings.Fields(l)
			if len(g) != 4 {
				return nil, bad()
			}
			nn, _ := strconv.Atoi(g[2])
			at, _ := strconv.ParseInt(g[3], 10, 64)
			b := &Batch{ID: g[1], N: nn, At: at, PID: p.PID, Offset: p.Offset, File: path}
			byID[b.ID] = b
			p.Batches = append(p.Batches, b)
		case "A":
			g := strings.Fields(l)
			if len(g) != 5 {
				return nil, bad()
			}
			i, _ := strconv.Atoi(g[2])
			due, _ := strconv.ParseInt(g[4], 10, 64)
			p.Acked = append(p.Acked, Acked{ID: g[3], Batch: g[1], Index: i, Due: due, PID: p.PID, Offset: p.Offset, File: path})
			if b := byID[g[1]]; b != nil {
				b.Acked = true
			}
		case "X":
			if len(f) < 2 {
				return nil, bad()
			}
			if b := byID[f[1]]; b != nil {
				b.SelfKill = true
			}
		case "G":
			g := strings.Fields(l)
			if len(g) != 3 {
				return nil, bad()
			}
			p.Calls, _ = strconv.ParseInt(g[1], 10, 64)
			p.Execs, _ = strconv.ParseInt(g[2], 10, 64)
		case "F":
			if len(f) < 2 {
				return nil, bad()
			}
			if b := byID[f[1]]; b != nil {
				b.Failed = "error"
				if len(f) == 3 {
					b.Failed = f[2]
				}
			}
		default:
			return nil, bad()
		}
	}
	return p, nil
}

// ReadHandler reads a handler ledger: one Run per S line, with the End of
// the first later E line of the same id and pid.
func ReadHandler(path string) ([]*Run, error) {
	ls, err := lines(path)
	if err != nil {
		return nil, err
	}
	var runs []*Run
	open := map[string][]*Run{} // id -> runs without an end, oldest first
	for n, l := range ls {
		g := strings.Fields(l)
		bad := func() error { return fmt.Errorf("%s:%d: malformed line %q", path, n+1, l) }
		if len(g) == 0 {
			return nil, bad()
		}
		switch g[0] {
		case "S":
			if len(g) != 11 {
				return nil, bad()
			}
			r := &Run{ID: g[1], Payload: g[4], File: path}
			if g[8] != "-" {
				r.Key = g[8]
			}
			r.Claimed, _ = strconv.ParseInt(g[9], 10, 64)
			r.Expires, _ = strconv.ParseInt(g[10], 10, 64)
			r.Start, _ = strconv.ParseInt(g[2], 10, 64)
			r.PID, _ = strconv.Atoi(g[3])
			r.Attempt, _ = strconv.Atoi(g[5])
			r.Recoveries, _ = strconv.Atoi(g[6])
			r.Due, _ = strconv.ParseInt(g[7], 10, 64)
			runs = append(runs, r)
			open[r.ID] = append(open[r.ID], r)
		case "E":
			if len(g) != 4 {
				return nil, bad()
			}
			end, _ := strconv.ParseInt(g[2], 10, 64)
			pid, _ := strconv.Atoi(g[3])
			q := open[g[1]]
			for i, r := range q {
				if r.PID == pid {
					r.End = end
					open[g[1]] = append(q[:i:i], q[i+1:]...)
					break
				}
			}
		case "C", "P": // ReadChained's, ReadAhead's
			if len(g) != 2 {
				return nil, bad()
			}
		default:
			return nil, bad()
		}
	}
	return runs, nil
}

// ReadChained reads a handler ledger's last C line: the batches the
// worker took with the results before them by then (0 without one).
func ReadChained(path string) (int64, error) { return lastCount(path, "C") }

// ReadAhead reads a handler ledger's last P line: the tasks the worker
// claimed ahead of its slots by then (0 without one).
func ReadAhead(path string) (int64, error) { return lastCount(path, "P") }

// lastCount reads the count of a handler ledger's last line of kind k.
func lastCount(path, k string) (int64, error) {
	ls, err := lines(path)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, l := range ls {
		if g := strings.Fields(l); len(g) == 2 && g[0] == k {
			if n, err = strconv.ParseInt(g[1], 10, 64); err != nil {
				return 0, fmt.Errorf("%s: malformed line %q", path, l)
			}
		}
	}
	return n, nil
}
