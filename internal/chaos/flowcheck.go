package chaos

import (
	"fmt"
	"sort"
	"strings"

	"github.com/bucketq/bucketq/buckets"
	"github.com/bucketq/bucketq/internal/chaos/ledger"
)

// byKey groups the runs of the handler ledgers by the task's key.
func byKey(obs *observed) map[string][]*ledger.Run {
	out := map[string][]*ledger.Run{}
	for _, rs := range obs.runs {
		for _, r := range rs {
			if r.Key != "" {
				out[r.Key] = append(out[r.Key], r)
			}
		}
	}
	return out
}

// checkKeyLimit proves from the handler ledgers that no more runs of one
// key overlapped at any instant than Scenario.KeyMaxRunning allows (per
// lane), and that some key reached it.
func (h *harness) checkKeyLimit(obs *observed) (string, error) {
	lanes := max(len(h.lanes), 1)
	bound := h.sc.KeyMaxRunning * lanes
	most, runs := 0, 0
	mostKey := ""
	for key, rs := range byKey(obs) {
		runs += len(rs)
		o := h.overlap(rs)
		if o.most > bound {
			return "", fmt.Errorf("key limit %d (%d lanes): %d runs of key %s overlapped at %s", h.sc.KeyMaxRunning, lanes, o.most, key, fmtMs(o.at))
		}
		if o.most > most {
			most, mostKey = o.most, key
		}
	}
	if most < h.sc.KeyMaxRunning {
		return "", fmt.Errorf("%w: at most %d runs of one key overlapped, the key limit is %d", errNotExercised, most, h.sc.KeyMaxRunning)
	}
	return fmt.Sprintf("key limit %d (%d lanes): at most %d runs of one key overlapped (key %s), over %d keyed runs",
		h.sc.KeyMaxRunning, lanes, most, mostKey, runs), nil
}

// checkRate proves from the claim times in the handler ledgers (the time
// a rate window counts, Task.Started) that no window of the rate's
// period held more than its N starts: of the claims in time order, the
// i-th and the (i+N)-th are at least the period apart. The queue's rate,
// or with perKey each key's. Some window must hold N, or the rate was
// not exercised. A run claimed but never started (its worker killed in
// between) is not in the ledgers: it only makes the windows emptier.
func (h *harness) checkRate(obs *observed, perKey bool) (string, error) {
	spec, what := h.sc.Rate, "queue rate"
	if perKey {
		spec, what = h.sc.KeyRate, "key rate"
	}
	rate, err := buckets.ParseRate(spec)
	if err != nil {
		return "", err
	}
	if len(h.lanes) > 1 {
		return "", fmt.Errorf("%w: the %s check reads one lane's window", errNotExercised, what)
	}
	groups := map[string][]int64{}
	for _, rs := range obs.runs {
		for _, r := range rs {
			k := ""
			if perKey {
				if r.Key == "" {
					continue
				}
				k = r.Key
			}
			groups[k] = append(groups[k], r.Claimed)
		}
	}
	n, per := int(rate.N), rate.Per.Milliseconds()
	full, claims := 0, 0
	for k, cs := range groups {
		sort.Slice(cs, func(i, j int) bool { return cs[i] < cs[j] })
		claims += len(cs)
		for i := n; i < len(cs); i++ {
			if cs[i]-cs[i-n] < per {
				where := ""
				if perKey {
					where = " of key " + k
				}
				return "", fmt.Errorf("%s %s: %d starts%s within %d ms (from %s)", what, spec, n+1, where, cs[i]-cs[i-n], fmtMs(cs[i-n]))
			}
		}
		for i := n - 1; i < len(cs); i++ {
			if cs[i]-cs[i-n+1] < per {
				full++
			}
		}
	}
	if full == 0 {
		return "", fmt.Errorf("%w: no window of the %s %s held its %d starts", errNotExercised, what, spec, n)
	}
	return fmt.Sprintf("%s %s: no window held more than %d of %d claims; %d windows held %d", what, spec, n, claims, full, n), nil
}

// checkExpiry proves that no run of a task started after its expiry (its
// claim time against the expiry in its S line), that every dead letter
// of this scenario is an expired task that never ran, and that some
// tasks did expire.
func (c *checker) checkExpiry() (string, error) {
	obs := c.obs
	runs, bounded := 0, 0
	for _, rs := range obs.runs {
		for _, r := range rs {
			runs++
			if r.Expires == 0 {
				continue
			}
			bounded++
			if r.Claimed > r.Expires {
				return "", fmt.Errorf("task %s started at %s, after its expiry at %s", r.ID, fmtMs(r.Claimed), fmtMs(r.Expires))
			}
		}
	}
	expired := 0
	for id, reason := range c.dead {
		if !strings.HasPrefix(reason, buckets.ReasonExpired+":") {
			return "", fmt.Errorf("task %s is dead for another reason than its expiry: %s", id, reason)
		}
		if len(obs.runs[id]) > 0 {
			return "", fmt.Errorf("task %s is dead as expired but ran", id)
		}
		expired++
	}
	if expired == 0 {
		return "", fmt.Errorf("%w: no task expired", errNotExercised)
	}
	return fmt.Sprintf("expiry: %d tasks expired unstarted (dead, reason expired); %d of %d runs had an expiry, none claimed after it", expired, bounded, runs), nil
}
