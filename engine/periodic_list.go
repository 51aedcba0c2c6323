package engine

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/schedule"
)

// PeriodicStatus is a periodic entry as stored in Redis, for listings.
type PeriodicStatus struct {
	Name     string `json:"name"`
	Cron     string `json:"cron,omitempty"`
	Every    string `json:"every,omitempty"`
	Location string `json:"tz,omitempty"`
	Type     string `json:"type"`
	Queue    string `json:"queue"`
	Missed   string `json:"missed"`
	// SkipIfRunning is the entry's overlap rule.
	SkipIfRunning bool `json:"skip_if_running,omitempty"`
	// Scheduled is the watermark: every firing up to it is enqueued (or
	// was skipped on purpose).
	Scheduled time.Time `json:"scheduled_until"`
	// Next is the first firing after now; zero if it never fires again.
	Next time.Time `json:"next"`
	// Last is the latest firing at or before now and its task's state
	// ("" when there is none; "expired" when its record is gone).
	Last      time.Time `json:"last,omitempty"`
	LastID    string    `json:"last_id,omitempty"`
	LastState State     `json:"last_state,omitempty"`
	// Declarers counts the processes that declared the entry and are
	// live; Orphaned is true when there is none: nobody extends its
	// firings, and it stops after its horizon.
	Declarers int  `json:"live_declarers"`
	Orphaned  bool `json:"orphaned"`
	// Invalid says why the stored definition cannot be read, if it cannot.
	Invalid string `json:"invalid,omitempty"`
}

// Periodics lists the periodic entries stored in the namespace, sorted by
// name. It writes nothing.
func (c *laneClient) Periodics(ctx context.Context) ([]PeriodicStatus, error) {
	conn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	infos, err := c.store.Periodics(ctx, conn)
	if err != nil {
		return nil, failed("list periodic entries", err)
	}
	now := c.cfg.Advanced.Clock.Now()
	out := make([]PeriodicStatus, len(infos))
	var ids []string
	var at []int
	for i, pi := range infos {
		st := PeriodicStatus{Name: pi.Name, Scheduled: fromMs(pi.Last)}
		for _, live := range pi.Live {
			if live {
				st.Declarers++
			}
		}
		st.Orphaned = st.Declarers == 0
		var d periodicDef
		if err := json.Unmarshal(pi.Def, &d); err != nil {
			st.Invalid = "definition unreadable: " + err.Error()
			out[i] = st
			continue
		}
		st.Cron, st.Every, st.Location, st.Type, st.Queue, st.Missed, st.SkipIfRunning =
			d.Cron, d.Every, d.Location, d.Type, d.Queue, d.Missed, d.SkipIfRunning
		sp, err := d.spec()
		var s *schedule.Schedule
		if err == nil {
			s, err = schedule.Parse(sp)
		}
		if err != nil {
			st.Invalid = err.Error()
			out[i] = st
			continue
		}
		st.Next = s.Next(now)
		upto := now
		if pi.Last > 0 && fromMs(pi.Last).Before(upto) {
			upto = fromMs(pi.Last)
		}
		if l := s.Latest(upto.AddDate(-1, 0, 0), upto, 1); len(l) == 1 {
			st.Last = l[0]
			st.LastID = schedule.FiringID(pi.Name, l[0])
			ids = append(ids, st.LastID)
			at = append(at, i)
		}
		out[i] = st
	}
	if len(ids) > 0 {
		recs, errs, err := c.store.Records(ctx, conn, ids)
		if err != nil {
			return nil, failed("list periodic entries", err)
		}
		for j, i := range at {
			switch {
			case errs[j] != nil && errors.Is(errs[j], buckets.ErrNotFound):
				out[i].LastState = "expired"
			case errs[j] != nil:
				out[i].LastState = "unreadable"
			default:
				// Where is not read: a waiting firing shows as ready.
				out[i].LastState = infoFromRecord(recs[j], buckets.InReady).State
			}
		}
	}
	return out, nil
}
