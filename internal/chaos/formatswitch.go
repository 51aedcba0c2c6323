package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The format-switch scenario (Scenario.FormatSwitch): the namespace is in
// use and unmarked when the processes start, so each of them, following
// the mark by default, writes the storage every release reads; a third of
// the way through production the harness marks it as an operator does
// (`engine storage compact`, Client.SetStorageFormat), and the processes
// take the mark up at their next look while the faults go on.

// useNamespace makes every lane's namespace look in use, as one an
// earlier release enqueued to: its set of queues exists.
func (h *harness) useNamespace() error {
	for i, l := range h.lanes {
		c := l.admin.Get()
		_, err := c.Do("SADD", l.keys.Queues(), "default")
		c.Close()
		if err != nil {
			return fmt.Errorf("chaos: lane %d: mark the namespace in use: %w", i, err)
		}
	}
	return nil
}

// markFormatLater marks every lane for the compact storage once a third
// of the production time has passed, unless ctx ends first, and notes
// when.
func (h *harness) markFormatLater(ctx context.Context) {
	if !sleep(ctx, h.opts.Duration/3) {
		return
	}
	for i, l := range h.lanes {
		// The operator's command, retried: a cut connection or a restart
		// is a fault of the run, not of the mark.
		for attempt := 0; ; attempt++ {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := l.client.SetStorageFormat(cctx, true)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil || attempt == 20 {
				h.logf("could not mark lane %d for the compact storage: %v", i, err)
				return
			}
			sleep(ctx, 100*time.Millisecond)
		}
	}
	h.mu.Lock()
	h.markedAt = time.Now()
	h.mu.Unlock()
	h.logf("namespace marked for the compact storage")
}

// checkSwitch reads the record of every acknowledged task at the end and
// tells, by when its last run ended, whether it is compact. Records in
// both formats must be seen: the earlier format, written before the mark,
// and the compact one, which only a process that took the mark up writes.
func (h *harness) checkSwitch(obs *observed) (string, error) {
	h.mu.Lock()
	marked := h.markedAt
	h.mu.Unlock()
	if marked.IsZero() {
		return "", errors.New("the namespace was never marked for the compact storage: the scenario did not switch formats")
	}
	at := marked.UnixMilli()
	var n [2][2]int // [ended after the mark][record compact]
	for id := range obs.acked {
		var end int64
		for _, r := range obs.runs[id] {
			end = max(end, r.End)
		}
		if end == 0 {
			continue
		}
		if v, ok := h.recordVersion(id); ok {
			n[btoi(end > at)][btoi(v == 4)]++
		}
	}
	note := fmt.Sprintf("task records at the end: of tasks done before the mark %d compact and %d in the earlier format; of those done after it %d compact and %d in the earlier format",
		n[0][1], n[0][0], n[1][1], n[1][0])
	if n[0][0]+n[1][0] == 0 || n[1][1] == 0 {
		return "", fmt.Errorf("records in both formats were not seen: the processes did not write the earlier format before the mark and the compact one after it (%s)", note)
	}
	return note, nil
}
