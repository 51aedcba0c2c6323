package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/engine/internal/rconn"
	"github.com/bucketq/bucketq/internal/schedule"
	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"
)

// Periodic is an entry of a schedule: a task enqueued at every firing of
// a cron expression or a fixed interval. Every process that declares the
// same entry (same Name) keeps its next firings enqueued; together they
// enqueue one task per firing, with no leader (see Server.AddPeriodic).
type Periodic struct {
	// Name identifies the entry across processes: 1-256 bytes of
	// printable UTF-8.
	Name string
	// Cron is a cron expression (5 fields, or 6 with seconds first, or a
	// descriptor such as @daily or @every 90s), read in Location. Exactly
	// one of Cron and Every.
	Cron string
	// Every is a fixed interval, whole seconds; firings are the multiples
	// of it since the Unix epoch, so every process agrees on them.
	Every time.Duration
	// Location is the IANA time zone of Cron ("Europe/Berlin"); empty
	// means UTC, never the host's zone.
	Location string

	// Type, Queue and Payload are the task's; Queue "" is the
	// DefaultQueue.
	Type    string
	Queue   string
	Payload []byte
	// Timeout and MaxAttempts are the task's options; zero means the
	// Config's defaults.
	Timeout     time.Duration
	MaxAttempts int

	// Missed says what happens to firings whose time passed while no
	// process declaring the entry ran (longer than the horizon): "skip"
	// runs none, "once" (or "", the default) runs the latest of them,
	// "all" or "all:N" runs each, up to N (default 100), the latest ones.
	Missed string
	// SkipIfRunning skips a firing (it becomes a cancelled task saying
	// why) when the previous firing's run is still running as it is
	// about to start.
	SkipIfRunning bool
}

// periodicDef is what is stored of a definition in the entry's hash.
type periodicDef struct {
	Cron          string `json:"cron,omitempty"`
	Every         string `json:"every,omitempty"`
	Location      string `json:"tz,omitempty"`
	Type          string `json:"type"`
	Queue         string `json:"queue"`
	Missed        string `json:"missed"`
	SkipIfRunning bool   `json:"skip_if_running,omitempty"`
	Timeout       string `json:"timeout,omitempty"`
	MaxAttempts   int    `json:"max_attempts,omitempty"`
}

func (d periodicDef) spec() (schedule.Spec, error) {
	sp := schedule.Spec{Cron: d.Cron, Location: d.Location}
	if d.Every != "" {
		v, err := time.ParseDuration(d.Every)
		if err != nil {
			return sp, err
		}
		sp.Every = v
	}
	return sp, nil
}

// Validate checks p as Server.AddPeriodic would with cfg: its name,
// schedule, missed policy and task fields. Errors match ErrInvalid.
func (p Periodic) Validate(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	_, err := validatePeriodic(cfg.withDefaults(), p)
	return err
}

// entry is a validated Periodic.
type entry struct {
	p      Periodic
	sched  *schedule.Schedule
	missed schedule.Missed
	def    []byte
	log    *slog.Logger

	superseded string // the stored fingerprint we last stood down for
}

// validatePeriodic checks p against cfg (which has its defaults).
func validatePeriodic(cfg Config, p Periodic) (*entry, error) {
	bad := func(err error) error {
		return fmt.Errorf("engine: periodic entry %q: %w: %w", p.Name, err, ErrInvalid)
	}
	if err := schedule.ValidateName(p.Name); err != nil {
		return nil, bad(err)
	}
	s, err := schedule.Parse(schedule.Spec{Cron: p.Cron, Every: p.Every, Location: p.Location})
	if err != nil {
		return nil, bad(err)
	}
	m, err := schedule.ParseMissed(p.Missed)
	if err != nil {
		return nil, bad(err)
	}
	if p.Queue == "" {
		p.Queue = cfg.DefaultQueue
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = cfg.DefaultMaxAttempts
	}
	if p.Timeout == 0 {
		p.Timeout = cfg.DefaultTimeout
	}
	probe := &buckets.Record{Queue: p.Queue, Type: p.Type, Payload: p.Payload,
		MaxAttempts: p.MaxAttempts, TimeoutMs: p.Timeout.Milliseconds()}
	if err := probe.Validate(cfg.MaxPayload); err != nil {
		return nil, bad(err)
	}
	d := periodicDef{Cron: p.Cron, Location: p.Location, Type: p.Type, Queue: p.Queue,
		Missed: m.String(), SkipIfRunning: p.SkipIfRunning, Timeout: p.Timeout.String(), MaxAttempts: p.MaxAttempts}
	if p.Every != 0 {
		d.Every = p.Every.String()
	}
	def, err := json.Marshal(d)
	if err != nil {
		return nil, bad(err)
	}
	return &entry{p: p, sched: s, missed: m, def: def}, nil
}

// Scheduler keeps the next firings of its periodic entries enqueued, up
// to Horizon ahead, as tasks with deterministic ids
// (schedule.FiringID(name, firing)); the record's Due is the firing time,
// and the handler sees it as Task.Due, with Task.Periodic naming the
// entry.
//
// Any number of processes may run a Scheduler with the same entries: the
// entry and its watermark (the last firing scheduled) live in Redis, and
// each scheduling pass is one optimistic transaction that moves the
// watermark together with the enqueues, so every firing is enqueued once.
// There is no leader and no lock; a restarted process continues from
// Redis. Firings that passed while no process declaring the entry ran for
// longer than Horizon are handled by the entry's Missed policy, once, by
// the first pass after.
//
// When two processes declare different schedules for one name, the
// process that started later wins: its first pass cancels the enqueued
// firings the new schedule does not have and stores the definition; a
// process with the older definition logs "superseded" and stops
// scheduling that entry. An entry no live process declares stops after
// its horizon and is listed as orphaned (Inspector.Periodics).
type scheduler struct {
	// Horizon is how far ahead firings are enqueued. Default 10 s.
	Horizon time.Duration
	// Pass is the time between two passes (±10 %). Default Horizon/3.
	Pass time.Duration
	// MaxSkew is the clock difference between processes tolerated
	// without firings counting as missed. Default 2 s.
	MaxSkew time.Duration

	pool  *redis.Pool
	cfg   Config
	store *buckets.Store
	id    string
	stamp int64
	log   *slog.Logger

	mu      sync.Mutex
	entries []*entry
	names   map[string]bool
	running bool
}

// maxPassFirings bounds the firings one pass of one entry enqueues.
const maxPassFirings = 100

// NewScheduler returns a Scheduler over pool with no entries.
func newScheduler(pool *redis.Pool, cfg Config) (*scheduler, error) {
	if pool == nil {
		return nil, fmt.Errorf("engine: NewScheduler: nil pool: %w", ErrInvalid)
	}
	cfg, st, err := cfg.prepare(pool)
	if err != nil {
		return nil, err
	}
	id := uuid.NewString()
	return &scheduler{pool: pool, cfg: cfg, store: st, id: id, stamp: ms(cfg.Advanced.Clock.Now()),
		names: map[string]bool{},
		log:   cfg.Logger.With(keyComponent, "scheduler", "scheduler", id)}, nil
}

// ID is the scheduler's process id, as the entries' declarers list it.
func (s *scheduler) ID() string { return s.id }

// Add declares an entry. It must be called before Run; a name declared
// twice is refused.
func (s *scheduler) Add(p Periodic) error {
	e, err := validatePeriodic(s.cfg, p)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return fmt.Errorf("engine: periodic entry %q: add entries before Run: %w", p.Name, ErrInvalid)
	}
	if s.names[p.Name] {
		return fmt.Errorf("engine: periodic entry %q declared twice: %w", p.Name, ErrInvalid)
	}
	s.names[p.Name] = true
	e.log = s.log.With("entry", p.Name)
	s.entries = append(s.entries, e)
	return nil
}

func (s *scheduler) timing() (horizon, pass, skew time.Duration, err error) {
	horizon, pass, skew = s.Horizon, s.Pass, s.MaxSkew
	if horizon == 0 {
		horizon = 10 * time.Second
	}
	if pass == 0 {
		pass = horizon / 3
	}
	if skew == 0 {
		skew = 2 * time.Second
	}
	if pass <= 0 || skew < 0 || horizon < pass+2*skew+time.Second {
		return 0, 0, 0, fmt.Errorf("engine: scheduler: horizon %v, pass %v, max skew %v: want horizon >= pass + 2*max skew + 1s: %w",
			horizon, pass, skew, ErrInvalid)
	}
	return horizon, pass, skew, nil
}

// Run runs passes every Pass until ctx ends. It returns nil when ctx
// ends, and an error only for a bad setting.
func (s *scheduler) Run(ctx context.Context) error {
	_, pass, _, err := s.timing()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.running = true
	n := len(s.entries)
	s.mu.Unlock()
	s.log.Info("scheduler started", "entries", n, "pass", pass)
	defer s.log.Info("scheduler stopped")
	var bo rconn.Backoff
	for i := 0; ; i++ {
		if err := s.RunPass(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !bo.Wait(ctx, s.log, "scheduling pass", err) {
				return nil
			}
			continue
		}
		bo.Reset()
		if i%10 == 0 {
			s.prune(ctx)
		}
		jitter := time.Duration(rand.Int64N(int64(pass)/5+1)) - pass/10
		if !rconn.Sleep(ctx, pass+jitter) {
			return nil
		}
	}
}

// RunPass runs one scheduling pass of every entry now. Run calls it every
// Pass; tests and tools may call it directly.
func (s *scheduler) RunPass(ctx context.Context) error {
	horizon, _, skew, err := s.timing()
	if err != nil {
		return err
	}
	s.mu.Lock()
	entries := append([]*entry(nil), s.entries...)
	s.mu.Unlock()
	conn, err := s.pool.GetContext(ctx)
	if err != nil {
		return fmt.Errorf("engine: scheduling pass: %w", err)
	}
	defer conn.Close()
	var errs []error
	for _, e := range entries {
		if err := s.pass(ctx, conn, e, horizon, skew); err != nil {
			errs = append(errs, err)
			if conn.Err() != nil {
				break
			}
		}
	}
	return errors.Join(errs...)
}

func (s *scheduler) pass(ctx context.Context, conn redis.Conn, e *entry, horizon, skew time.Duration) error {
	now := s.cfg.Advanced.Clock.Now()
	nowMs := ms(now)
	aliveTTL := int64(max(3*horizon, horizon+2*skew).Seconds()) + 1
	cancelTTL := max(s.cfg.doneTTL(), int64((horizon+2*skew)/time.Second)+1)
	var skipped int
	var planned []*buckets.Record // the last plan's firings
	plan := func(last int64) buckets.PassPlan {
		p := e.sched.Plan(e.missed, fromMs(last), now, horizon, maxPassFirings)
		skipped = p.Skipped
		out := buckets.PassPlan{Last: ms(p.Last)}
		if p.Last.IsZero() {
			out.Last = 0
		}
		for _, f := range append(p.Missed, p.Upcoming...) {
			out.Recs = append(out.Recs, s.firing(e, f, nowMs))
		}
		planned = out.Recs
		return out
	}
	stale := func(oldDef []byte, oldLast int64) []string {
		var d periodicDef
		if json.Unmarshal(oldDef, &d) != nil {
			return nil
		}
		sp, err := d.spec()
		if err != nil {
			return nil
		}
		old, err := schedule.Parse(sp)
		if err != nil {
			return nil
		}
		var ids []string
		for _, f := range old.Between(now, fromMs(oldLast), maxPassFirings) {
			if !e.sched.Next(f.Add(-time.Nanosecond)).Equal(f) {
				ids = append(ids, schedule.FiringID(e.p.Name, f))
			}
		}
		return ids
	}
	pe := buckets.PassEntry{Name: e.p.Name, Def: e.def, FP: e.sched.Fingerprint(), Stamp: s.stamp}
	res, err := s.store.SchedulePass(ctx, conn, pe, nowMs, s.id, aliveTTL, cancelTTL, plan, stale)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	switch {
	case res.Superseded:
		if e.superseded != res.StoredFP {
			e.superseded = res.StoredFP
			e.log.Warn("periodic entry superseded by a newer definition; not scheduling it", "stored_fingerprint", res.StoredFP)
		}
		return nil
	case res.Redefined:
		e.log.Info("periodic entry redefined", "cancelled", len(res.Cancelled))
	}
	e.superseded = ""
	if skipped > 0 {
		e.log.Info("missed firings skipped", "skipped", skipped, "policy", e.missed.String())
	}
	if len(res.Enqueued) > 0 {
		e.log.Debug("firings enqueued", "n", len(res.Enqueued), "last", fromMs(res.Last))
		s.cfg.observeEnqueued(firingsWritten(planned, res.Enqueued), now)
	}
	return nil
}

// firingsWritten returns the records of recs whose ids are among ids.
func firingsWritten(recs []*buckets.Record, ids []string) []*buckets.Record {
	in := make(map[string]bool, len(ids))
	for _, id := range ids {
		in[id] = true
	}
	var out []*buckets.Record
	for _, r := range recs {
		if in[r.ID] {
			out = append(out, r)
		}
	}
	return out
}

// firing is the task record of e's firing at f.
func (s *scheduler) firing(e *entry, f time.Time, now int64) *buckets.Record {
	return &buckets.Record{
		ID: schedule.FiringID(e.p.Name, f), Queue: e.p.Queue, Type: e.p.Type, Payload: e.p.Payload,
		State: buckets.StateWaiting, MaxAttempts: e.p.MaxAttempts, TimeoutMs: e.p.Timeout.Milliseconds(),
		Created: now, Due: msCeil(f), Periodic: e.p.Name, SkipIfRunning: e.p.SkipIfRunning,
	}
}

// prune drops dead declarers from the entries' declarer sets.
func (s *scheduler) prune(ctx context.Context) {
	s.mu.Lock()
	entries := append([]*entry(nil), s.entries...)
	s.mu.Unlock()
	conn, err := s.pool.GetContext(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	for _, e := range entries {
		if _, err := s.store.PruneDeclarers(ctx, conn, e.p.Name); err != nil {
			e.log.Debug("pruning declarers", "err", err)
			return
		}
	}
}
