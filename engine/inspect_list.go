package engine

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/safetext"
	"github.com/gomodule/redigo/redis"
)

// Filter names tasks: those of a queue in a state, optionally matching a
// search.
type Filter struct {
	// Queue is required for scheduled, ready and retrying; for running
	// and dead, "" means every queue.
	Queue string
	// State is one of StateScheduled, StateReady, StateRunning,
	// StateRetrying, StateDead. Done and cancelled tasks are found by id
	// (Task), see ErrInvalid.
	State State
	// Search, when set, keeps the tasks whose id or type equals it or
	// whose payload contains it.
	Search string
	// Priority, when 1 to 4, keeps the tasks of that level (Priority);
	// 0 keeps every level. Ready, scheduled and retrying tasks of every
	// level are listed level by level, level 1 first.
	Priority int
	// Key, when set, keeps the tasks of that key (the Key option). A
	// key's ready and scheduled tasks wait in lists of its own, which a
	// listing of ready, scheduled or retrying tasks walks only for the
	// key it names: without Key, those listings leave keyed tasks out.
	Key string
}

// ListOptions is a Filter, a page size and where to resume.
type ListOptions struct {
	Filter
	// Limit is the most tasks a page returns: 1 to 1000; zero means 50.
	Limit int
	// Cursor is the Next of the previous page; "" starts at the
	// beginning.
	Cursor string
	// MaxBytes, when above zero, bounds the bytes of task records a page
	// reads: it reads them in batches and stops after the batch that
	// reaches MaxBytes (so at least one batch), its Next going on from
	// there. Zero reads every record of the page at once.
	MaxBytes int64

	place string // the level's place (buckets.Place) a list or bucket walk reads
}

// Page sizes of ListTasks.
const (
	defaultListLimit = 50
	maxListLimit     = 1000
	// searchScan is how many tasks a page with a Search (or a state that
	// must be told apart by reading records: retrying, and running or
	// dead of one queue) reads at most, matches or not.
	searchScan = 1000
)

// TaskPage is one page of ListTasks.
type TaskPage struct {
	Tasks []*TaskInfo
	// Total is the exact number of tasks in the state (of the queue, or
	// of all queues), as of this page's read; it counts the state, not
	// the matches of a Search. The states are disjoint: a failed task
	// waiting in its bucket is retrying, not scheduled; once due it is
	// ready.
	Total int64
	// Next resumes the listing after this page; "" when the listing is
	// complete. A page may hold fewer than Limit tasks (even none) and
	// still have a Next: each call reads a bounded amount.
	Next string
	// BytesRead is the size of the task records this page read.
	BytesRead int64
}

// cursor is the state of a listing between pages. In a list (ready list,
// bucket), Seen holds a hash of each id the page read (the last maxSeen)
// and Pos the position of the last (from the end where the list is
// consumed); Ts is the bucket. In a sorted set (pending sets, dead
// letters), Worker and Score are the place reached, Anchors the last id
// read and Pos how many of that score were read.
type cursor struct {
	Seen    []byte   `json:"h,omitempty"`
	Anchors []string `json:"a,omitempty"`
	Pos     int64    `json:"p,omitempty"`
	Ts      int64    `json:"t,omitempty"`
	Worker  string   `json:"w,omitempty"`
	Score   *int64   `json:"s,omitempty"`
	Done    bool     `json:"d,omitempty"` // the current bucket or worker is finished
	Level   int      `json:"l,omitempty"` // the level walked, above 1 (a listing of every level)
}

const cursorAnchors = 3

// slack is how far a list's consumption may move an anchor between two
// pages before a page spends its call looking for it (it then returns no
// task, and a Next that goes on looking).
const slack = 1000

func (c cursor) encode() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	var c cursor
	if s == "" {
		return c, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		err = d.Decode(&c)
	}
	if err != nil || c.Pos < 0 || len(c.Anchors) > 1 || len(c.Seen)%8 != 0 || len(c.Seen) > 8*maxSeen || c.Level < 0 || c.Level > buckets.MaxLevel {
		return c, fmt.Errorf("engine: cursor %q: not a cursor of ListTasks: %w", s, ErrInvalid)
	}
	return c, nil
}

func (o *ListOptions) check() error {
	if o.Limit == 0 {
		o.Limit = defaultListLimit
	}
	if o.Limit < 1 || o.Limit > maxListLimit {
		return fmt.Errorf("engine: list limit %d: want 1 to %d: %w", o.Limit, maxListLimit, ErrInvalid)
	}
	return o.Filter.check()
}

func (f *Filter) check() error {
	if f.Priority < 0 || f.Priority > buckets.MaxLevel {
		return fmt.Errorf("engine: priority %d: want 1 to %d, or 0 for every level: %w", f.Priority, buckets.MaxLevel, ErrInvalid)
	}
	if f.Key != "" && !buckets.ValidName(f.Key) {
		return fmt.Errorf("engine: key %s: want 1-64 of A-Z a-z 0-9 _ . -: %w", safetext.Quote(f.Key), ErrInvalid)
	}
	switch f.State {
	case StateScheduled, StateReady, StateRetrying:
		if err := validateQueue(f.Queue); err != nil {
			return err
		}
	case StateRunning, StateDead:
		if f.Queue != "" {
			if err := validateQueue(f.Queue); err != nil {
				return err
			}
		}
	case StateDone, StateCancelled:
		return fmt.Errorf("engine: %s tasks are found by id only (their records are indexed nowhere): %w", f.State, ErrInvalid)
	default:
		return fmt.Errorf("engine: state %q: want scheduled, ready, running, retrying or dead: %w", f.State, ErrInvalid)
	}
	return nil
}

// matches reports whether v is one of the filter's tasks.
func (f *Filter) matches(r *buckets.Record, v *TaskInfo) bool {
	if f.Queue != "" && r.Queue != f.Queue {
		return false
	}
	if f.Priority != 0 && r.Level() != f.Priority {
		return false
	}
	if f.Key != "" && r.Key != f.Key {
		return false
	}
	switch f.State {
	case StateReady:
		if v.State != StateReady {
			return false
		}
	default:
		if v.State != f.State {
			return false
		}
	}
	if f.Search == "" {
		return true
	}
	return r.ID == f.Search || r.Type == f.Search || bytes.Contains(r.Payload, []byte(f.Search))
}

// scan is how many entries a page reads at most.
func (o *ListOptions) scan() int {
	if o.Search != "" || o.State == StateRetrying || ((o.Queue != "" || o.Priority != 0 || o.Key != "") && (o.State == StateRunning || o.State == StateDead)) {
		return max(o.Limit, searchScan)
	}
	return o.Limit
}

// ListTasks is Inspector.ListTasks for one lane.
func (in *laneInspector) ListTasks(ctx context.Context, opts ListOptions) (*TaskPage, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	cur, err := decodeCursor(opts.Cursor)
	if err != nil {
		return nil, err
	}
	conn, err := in.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var page *TaskPage
	switch opts.State {
	case StateReady, StateScheduled, StateRetrying:
		page, err = in.listLevels(ctx, conn, &opts, cur)
	case StateRunning:
		page, err = in.listRunning(ctx, conn, &opts, cur)
	case StateDead:
		page, err = in.listDead(ctx, conn, &opts, cur)
	}
	if err == nil && opts.State == StateRunning && len(page.Tasks) > 0 {
		err = in.readProgress(ctx, conn, page.Tasks)
	}
	if err != nil {
		return nil, failed(fmt.Sprintf("list %s tasks", opts.State), err)
	}
	return page, nil
}

// readProgress fills in the progress of running tasks: one MGET.
func (in *laneInspector) readProgress(ctx context.Context, conn redis.Conn, ts []*TaskInfo) error {
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	ps, err := in.store.Progresses(ctx, conn, ids)
	if err != nil {
		return err
	}
	for i, p := range ps {
		ts[i].setProgress(p)
	}
	return nil
}

// listLevels lists the ready, scheduled or retrying tasks of o's queue:
// of the level o names, or, with no level named, of level 1, then of each
// level in use (the levels set, one more command), one level after the
// other, the cursor saying which. Total is the state's figure of the
// whole queue, except that ready tasks of one level named count that
// level's.
func (in *laneInspector) listLevels(ctx context.Context, conn redis.Conn, o *ListOptions, cur cursor) (*TaskPage, error) {
	lvl := o.Priority
	if lvl == 0 {
		lvl = max(cur.Level, 1)
	}
	o.place = buckets.KeyPlace(buckets.Place(o.Queue, lvl), o.Key)
	var page *TaskPage
	var err error
	if o.State == StateReady {
		page, err = in.listReady(ctx, conn, o, cur)
	} else {
		page, err = in.listScheduled(ctx, conn, o, cur)
	}
	if err != nil || o.Priority != 0 {
		return page, err
	}
	levels, err := in.store.Levels(ctx, conn)
	if err != nil {
		return nil, err
	}
	if page.Next != "" {
		c, err := decodeCursor(page.Next)
		if err != nil {
			return nil, err
		}
		c.Level = 0
		if lvl > 1 {
			c.Level = lvl
		}
		page.Next = c.encode()
	} else {
		for _, p := range levels[o.Queue] {
			if _, l := buckets.SplitPlace(p); l > lvl {
				page.Next = cursor{Level: l}.encode()
				break
			}
		}
	}
	if o.State == StateReady && o.Key == "" && len(levels[o.Queue]) > 0 {
		if page.Total, err = in.total(ctx, conn, &o.Filter); err != nil {
			return nil, err
		}
	}
	return page, nil
}

// total reads the gauge of the filter's state (summed over every queue
// when Queue is ""): one HGETALL per queue concerned.
func (in *laneInspector) total(ctx context.Context, conn redis.Conn, f *Filter) (int64, error) {
	names := []string{f.Queue}
	if f.Queue == "" {
		var err error
		if names, err = in.store.QueueNames(ctx, conn); err != nil {
			return 0, err
		}
	}
	snap, err := in.store.Snapshot(ctx, conn, names)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, s := range snap {
		switch f.State {
		case StateScheduled:
			n += s.Scheduled
		case StateRetrying:
			n += s.Retrying
		case StateRunning:
			n += s.Running
		case StateDead:
			n += s.Dead
		case StateReady:
			n += s.Ready
		}
	}
	return n, nil
}

// judgeBatch is how many records judge reads with one MGET under a
// byte budget.
const judgeBatch = 16

// judge reads the records of ids (one MGET, or one per judgeBatch ids
// under o.MaxBytes) and returns the views of those matching the filter,
// up to o.Limit, how many ids it went through to find them, and how many
// bytes of records it read. With o.MaxBytes it stops after the batch
// that reaches it.
func (in *laneInspector) judge(ctx context.Context, conn redis.Conn, o *ListOptions, ids []string, where buckets.Where) ([]*TaskInfo, int, int64, error) {
	batch := len(ids)
	if o.MaxBytes > 0 {
		batch = judgeBatch
	}
	var out []*TaskInfo
	var read int64
	for at := 0; at < len(ids); at += batch {
		if o.MaxBytes > 0 && read >= o.MaxBytes {
			return out, at, read, nil
		}
		recs, _, err := in.store.Records(ctx, conn, ids[at:min(len(ids), at+batch)])
		if err != nil {
			return nil, 0, 0, err
		}
		for i, r := range recs {
			if len(out) == o.Limit {
				return out, at + i, read, nil
			}
			if r == nil {
				continue // moved on meanwhile, or a bad record the claim buries
			}
			read += recordSize(r)
			v := viewOf(r, where)
			if o.Filter.matches(r, v) {
				out = append(out, v)
			}
		}
	}
	return out, len(ids), read, nil
}

// recordSize is about the bytes r took to read: its variable parts and
// a little for the fixed ones.
func recordSize(r *buckets.Record) int64 {
	n := 64 + len(r.Queue) + len(r.Type) + len(r.Payload) + len(r.Worker) + len(r.LastError) + len(r.Periodic)
	for k, v := range r.Metadata {
		n += len(k) + len(v)
	}
	return int64(n)
}

// maxSeen is how many ids of a page a list cursor remembers.
const maxSeen = 128

func idHash(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// seenOf hashes the last maxSeen of ids for a cursor.
func seenOf(ids []string) []byte {
	ids = ids[max(0, len(ids)-maxSeen):]
	out := make([]byte, 0, 8*len(ids))
	for _, id := range ids {
		out = binary.BigEndian.AppendUint64(out, idHash(id))
	}
	return out
}

type seenSet map[uint64]bool

func (c cursor) seen() seenSet {
	s := seenSet{}
	for i := 0; i+8 <= len(c.Seen); i += 8 {
		s[binary.BigEndian.Uint64(c.Seen[i:])] = true
	}
	return s
}

func (s seenSet) has(id string) bool { return len(s) > 0 && s[idHash(id)] }

// anchored finds where to resume in a window of a list: after the latest
// id of the previous page still in it. It returns the index in window to
// start from, and whether such an id was found.
func anchored(window []string, seen seenSet) (int, bool) {
	for i := len(window) - 1; i >= 0; i-- {
		if seen.has(window[i]) {
			return i + 1, true
		}
	}
	return 0, false
}
