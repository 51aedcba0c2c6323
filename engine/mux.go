package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/safetext"
)

// Handler runs tasks. ProcessTask's error decides what happens next: nil
// is success; Snooze asks to run again later without counting a
// failure; Permanent skips the remaining attempts; any other error is a
// failure, retried with backoff until MaxAttempts. The context ends at
// the task's timeout and when the worker shuts down.
type Handler interface {
	ProcessTask(ctx context.Context, t *Task) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, t *Task) error

// ProcessTask calls f.
func (f HandlerFunc) ProcessTask(ctx context.Context, t *Task) error { return f(ctx, t) }

// Middleware wraps a Handler.
type Middleware func(Handler) Handler

// Mux routes tasks to handlers by type. It is safe for concurrent use;
// register handlers before the worker starts.
type Mux struct {
	mu       sync.RWMutex
	handlers map[string]Handler
	mw       []Middleware
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{handlers: map[string]Handler{}} }

// Handle registers h for task type typ. It panics if typ already has a
// handler or h is nil, as net/http's ServeMux does: two registrations of
// one type are a mistake to catch at start-up, not a silent replacement.
func (m *Mux) Handle(typ string, h Handler) {
	if h == nil {
		panic(fmt.Sprintf("engine: Mux.Handle(%q): nil handler", typ))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.handlers[typ]; ok {
		panic(fmt.Sprintf("engine: Mux.Handle(%q): a handler for this type is registered already", typ))
	}
	m.handlers[typ] = h
}

// HandleFunc registers f for task type typ.
func (m *Mux) HandleFunc(typ string, f func(ctx context.Context, t *Task) error) {
	if f == nil {
		panic(fmt.Sprintf("engine: Mux.HandleFunc(%q): nil function", typ))
	}
	m.Handle(typ, HandlerFunc(f))
}

// Use adds middleware, applied to every handler in the order given (the
// first is outermost).
func (m *Mux) Use(mw ...Middleware) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mw = append(m.mw, mw...)
}

// Types lists the registered task types.
func (m *Mux) Types() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.handlers))
	for t := range m.handlers {
		out = append(out, t)
	}
	return out
}

// ProcessTask runs the handler for t.Type through the middleware, or
// returns an error wrapping ErrNoHandler.
func (m *Mux) ProcessTask(ctx context.Context, t *Task) error {
	m.mu.RLock()
	h, ok := m.handlers[t.Type]
	mw := m.mw
	m.mu.RUnlock()
	if !ok {
		h = HandlerFunc(func(context.Context, *Task) error {
			return fmt.Errorf("no handler for type %s: %w", safetext.Quote(t.Type), ErrNoHandler)
		})
	}
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h.ProcessTask(ctx, t)
}

// IsSnooze reports whether err (or one it wraps) came from Snooze, and
// the delay it asked for.
func IsSnooze(err error) (time.Duration, bool) {
	var ra *snoozeError
	if errors.As(err, &ra) {
		return ra.d, true
	}
	return 0, false
}

// validateQueue checks a queue name as Enqueue does: 1 to 64 of A-Z a-z
// 0-9 _ . -.
func validateQueue(name string) error {
	if !buckets.ValidName(name) {
		return fmt.Errorf("engine: queue name %s: want 1-64 of A-Z a-z 0-9 _ . -: %w", safetext.Quote(name), ErrInvalid)
	}
	return nil
}

// snoozeError is the error Snooze returns.
type snoozeError struct{ d time.Duration }

func (r *snoozeError) Error() string { return fmt.Sprintf("engine: snoozed for %v", r.d) }

// Snooze is what a handler returns to run the task again after d without
// using an attempt: the "lock is busy, try in 5 s" case. Snoozes are
// counted apart from failures (Task.Snoozes, QueueInfo.Snoozed); past
// Advanced.MaxSnoozes of them the task goes to the dead letters with the
// reason "snoozed too often".
func Snooze(d time.Duration) error { return &snoozeError{d: max(d, 0)} }

// permanent marks an error that must not be retried.
type permanent struct{ err error }

func (p *permanent) Error() string { return p.err.Error() }
func (p *permanent) Unwrap() error { return p.err }

// Permanent wraps err so the task skips its remaining attempts and goes
// to the dead letters with err. errors.Is/As still see err.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &permanent{err: err}
}

// IsPermanent reports whether err was marked with Permanent.
func isPermanent(err error) bool {
	var p *permanent
	return errors.As(err, &p)
}

// panicError is the failure recorded when a handler panics.
type panicError struct {
	Value any
	Stack string
}

func (p *panicError) Error() string { return fmt.Sprintf("handler panic: %v", p.Value) }

// callHandler runs h, turning a panic into a *panicError.
func callHandler(ctx context.Context, h Handler, t *Task) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{Value: v, Stack: string(debug.Stack())}
		}
	}()
	return h.ProcessTask(ctx, t)
}
