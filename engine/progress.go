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
// a done task's record is kept). It costs no round trip: a run's
// progress is written at most once a second, the last value always, on
// a connection of its own. A value that is not finite is refused with
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

// progressWriter writes the progress handlers report (SetProgress), each
// run's at most once per progressEvery, on connections of the pool.
type progressWriter struct {
	pool  *redis.Pool
	store *buckets.Store
	clock Clock
	log   *slog.Logger
	ttl   func(timeout time.Duration) int64 // seconds a progress is kept
	wg    sync.WaitGroup                    // writes under way
	sent  atomic.Int64                      // writes sent, for tests
}

func newProgressWriter(pool *redis.Pool, st *buckets.Store, cfg Config, log *slog.Logger) *progressWriter {
	return &progressWriter{pool: pool, store: st, clock: cfg.Advanced.Clock, log: log,
		ttl: func(timeout time.Duration) int64 {
			// The run, its grace, and the done record's retention.
			d := timeout + cfg.Advanced.LeaseGrace + max(cfg.DoneRetention, 0)
			return max(int64(d/time.Second), 1)
		}}
}

// box returns the progress box of one run of task id.
func (pw *progressWriter) box(id string, timeout time.Duration) *progressBox {
	return &progressBox{pw: pw, id: id, ttl: pw.ttl(timeout)}
}

// wait waits for the writes under way.
func (pw *progressWriter) wait() { pw.wg.Wait() }

func (pw *progressWriter) write(id string, p buckets.Progress, ttl int64) {
	ctx, cancel := context.WithTimeout(context.Background(), progressWriteTimeout)
	defer cancel()
	conn, err := pw.pool.GetContext(ctx)
	pw.sent.Add(1)
	if err == nil {
		err = pw.store.SetProgress(ctx, conn, id, p, ttl)
		conn.Close()
	}
	if err != nil {
		pw.log.Debug("task progress not written", keyTaskID, id, keyErr, err)
	}
}

// progressBox holds one run's last reported progress and when it was
// written: a report writes at once when the last write is progressEvery
// old, else it leaves the write to a timer that writes the latest value
// then; close writes what is still unwritten.
type progressBox struct {
	pw  *progressWriter
	id  string
	ttl int64

	mu      sync.Mutex
	cur     buckets.Progress
	dirty   bool        // cur not written yet
	last    time.Time   // last write started
	timer   *time.Timer // a write due later, when set
	writing bool        // a write is under way
	closed  bool
}

func (b *progressBox) set(value float64, note string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.cur = buckets.Progress{Value: value, Note: note, At: ms(b.pw.clock.Now())}
	b.dirty = true
	if b.timer != nil || b.writing {
		return // the pending write takes the latest value
	}
	if wait := progressEvery - time.Since(b.last); wait > 0 {
		b.pw.wg.Add(1)
		b.timer = time.AfterFunc(wait, func() {
			defer b.pw.wg.Done()
			b.mu.Lock()
			b.timer = nil
			b.mu.Unlock()
			b.flush()
		})
		return
	}
	b.pw.wg.Add(1)
	go func() {
		defer b.pw.wg.Done()
		b.flush()
	}()
}

// flush writes the latest value if it is unwritten and no other write is
// under way (that one then writes it after its own).
func (b *progressBox) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.dirty && !b.writing {
		p := b.cur
		b.dirty, b.writing, b.last = false, true, time.Now()
		b.mu.Unlock()
		b.pw.write(b.id, p, b.ttl)
		b.mu.Lock()
		b.writing = false
		if b.dirty && !b.closed && b.timer == nil {
			// Reported while the write was under way: write it one
			// interval after this one. (Once closed, the loop writes
			// the last value at once.)
			b.pw.wg.Add(1)
			b.timer = time.AfterFunc(progressEvery, func() {
				defer b.pw.wg.Done()
				b.mu.Lock()
				b.timer = nil
				b.mu.Unlock()
				b.flush()
			})
			return
		}
	}
}

// close ends the run's reporting: the last value, if unwritten, is written
// now (in the caller's goroutine, before the run's result), so a done
// task shows where its handler ended.
func (b *progressBox) close() {
	b.mu.Lock()
	b.closed = true
	if b.timer != nil && b.timer.Stop() {
		b.timer = nil
		b.pw.wg.Done()
	}
	pending := b.dirty && !b.writing
	b.mu.Unlock()
	if pending {
		b.flush()
	}
}
