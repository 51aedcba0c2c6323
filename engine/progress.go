package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// progressEvery is how often one run's progress is written at most: a
// handler may report it thousands of times a second, and each report
// only replaces the value in memory until its write is due.
const progressEvery = time.Second

// progressWriteTimeout bounds one write of a progress.
const progressWriteTimeout = 5 * time.Second

var errNoProgressHere = errors.New("engine: SetProgress outside a handler")

type progressKey struct{}

// SetProgress reports how far the running task whose handler was given ctx
// has come: value means what the handler wants (a percentage, items done)
// and note says it in words (at most 256 bytes of UTF-8). Lookup, the
// Inspector, `engine lookup` and the dashboard show the last one reported,
// with its time, while the run goes on and after it ends (for as long as
// a done task's record is kept). It never waits for Redis: the worker
// writes a run's latest report at most once a second, and its last one,
// together with its other runs' in one pipelined round trip. A value that is not finite is refused with
// ErrInvalid, a longer note with ErrTooLarge.
func SetProgress(ctx context.Context, value float64, note string) error {
	b, _ := ctx.Value(progressKey{}).(*progressBox)
	if b == nil {
		return errNoProgressHere
	}
	if math.IsNaN(value) || math.IsInf(value, 0) {
		return fmt.Errorf("engine: progress %v: want a finite number: %w", value, ErrInvalid)
	}
	if len(note) > buckets.MaxProgressNote {
		return fmt.Errorf("engine: progress note of %d bytes, limit %d: %w", len(note), buckets.MaxProgressNote, ErrTooLarge)
	}
	if !utf8.ValidString(note) {
		return fmt.Errorf("engine: progress note is not UTF-8: %w", ErrInvalid)
	}
	b.set(value, note)
	return nil
}

// progressWriter writes the progress handlers report (SetProgress): each
// run's box offers its latest value at most once per progressEvery (and
// its last one when the run ends), and one goroutine per worker writes
// what was offered, the latest value per task, with one pipelined round
// trip on one connection. However often handlers report, the worker
// sends at most one SETEX per running task per second, and never makes
// a handler wait for Redis.
type progressWriter struct {
	pool  *redis.Pool
	store *buckets.Store
	clock Clock
	log   *slog.Logger
	ttl   func(timeout time.Duration) int64 // seconds a progress is kept

	mu      sync.Mutex
	pending map[string]pendingProgress // by task id: the latest offered
	wake    chan struct{}              // an offer since the last write
	sent    atomic.Int64               // SETEX sent, for tests
}

type pendingProgress struct {
	p   buckets.Progress
	ttl int64
}

func newProgressWriter(pool *redis.Pool, st *buckets.Store, cfg Config, log *slog.Logger) *progressWriter {
	return &progressWriter{pool: pool, store: st, clock: cfg.Advanced.Clock, log: log,
		pending: map[string]pendingProgress{}, wake: make(chan struct{}, 1),
		ttl: func(timeout time.Duration) int64 {
			// The run, its grace, and the done record's retention.
			d := timeout + cfg.Advanced.LeaseGrace + max(cfg.DoneRetention, 0)
			return max(int64(d/time.Second), 1)
		}}
}

// initBox makes b the progress box of one run of task id.
func (pw *progressWriter) initBox(b *progressBox, id string, timeout time.Duration) {
	b.pw, b.id, b.ttl = pw, id, pw.ttl(timeout)
}

// offer queues task id's progress for the next write, replacing one not
// written yet.
func (pw *progressWriter) offer(id string, p buckets.Progress, ttl int64) {
	pw.mu.Lock()
	pw.pending[id] = pendingProgress{p, ttl}
	pw.mu.Unlock()
	select {
	case pw.wake <- struct{}{}:
	default:
	}
}

// run writes what is offered until ctx ends, then what is left.
func (pw *progressWriter) run(ctx context.Context) {
	for {
		select {
		case <-pw.wake:
			pw.flush(ctx)
		case <-ctx.Done():
			pw.flush(context.WithoutCancel(ctx)) // flush bounds its own round trip
			return
		}
	}
}

// flush writes the pending progress in one pipelined round trip. A
// failure drops it: progress is informational.
func (pw *progressWriter) flush(ctx context.Context) {
	pw.mu.Lock()
	batch := pw.pending
	if len(batch) > 0 {
		pw.pending = make(map[string]pendingProgress, len(batch))
	}
	pw.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, progressWriteTimeout)
	defer cancel()
	pw.sent.Add(int64(len(batch)))
	conn, err := pw.pool.GetContext(ctx)
	if err == nil {
		err = pw.store.SetProgresses(ctx, conn, progressWrites(batch))
		conn.Close()
	}
	if err != nil {
		pw.log.Debug("task progress not written", "tasks", len(batch), keyErr, err)
	}
}

// progressWrites lists the pending progress as the store writes it.
func progressWrites(m map[string]pendingProgress) []buckets.ProgressWrite {
	out := make([]buckets.ProgressWrite, 0, len(m))
	for id, pp := range m {
		out = append(out, buckets.ProgressWrite{ID: id, Progress: pp.p, TTL: pp.ttl})
	}
	return out
}

// progressBox holds one run's last reported progress: a report is offered
// for writing at once when the last offer is progressEvery old, else a
// timer offers the latest value then; close offers what is still
// unoffered.
type progressBox struct {
	pw  *progressWriter
	id  string
	ttl int64

	mu     sync.Mutex
	cur    buckets.Progress
	dirty  bool        // cur not offered yet
	last   time.Time   // last offer
	timer  *time.Timer // an offer due later, when set
	closed bool
}

func (b *progressBox) set(value float64, note string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.cur = buckets.Progress{Value: value, Note: note, At: ms(b.pw.clock.Now())}
	b.dirty = true
	if b.timer != nil {
		return // the timer offers the latest value
	}
	if wait := progressEvery - time.Since(b.last); wait > 0 {
		b.timer = time.AfterFunc(wait, b.due)
		return
	}
	b.offerLocked()
}

// due is the timer's: offer the latest value.
func (b *progressBox) due() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.timer = nil
	if b.dirty {
		b.offerLocked()
	}
}

func (b *progressBox) offerLocked() {
	b.dirty, b.last = false, time.Now()
	b.pw.offer(b.id, b.cur, b.ttl)
}

// close ends the run's reporting: the last value, if not offered yet, is
// offered now, so a done task shows where its handler ended.
func (b *progressBox) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if b.dirty {
		b.offerLocked()
	}
}
