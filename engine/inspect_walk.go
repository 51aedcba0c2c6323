package engine

import (
	"context"
	"strconv"

	"github.com/bucketq/bucketq/buckets"
	"github.com/gomodule/redigo/redis"
)

// The walks of ListTasks, one per structure.
//
// Lists (ready lists, buckets) are consumed from one end and grow at the
// other: a ready list is popped at its tail and pushed at its head, a
// bucket moved from its head and appended at its tail. A walk counts
// positions from the consumed end, and resumes after the last ids it read
// (the anchors), looked for in a window around their old position: the
// consumption of the list between two pages only moves them towards the
// consumed end. Sorted sets (pending sets, dead letters) resume at a
// score, skipping the members of that score already read.

// maxVisits bounds the buckets or workers one page visits (one command
// each).
const maxVisits = 64

// listReady walks queue q's ready list in pop order: two reads in one
// MULTI/EXEC (LLEN, LRANGE of the window), then one MGET of the records.
func (in *laneInspector) listReady(ctx context.Context, conn redis.Conn, o *ListOptions, cur cursor) (*TaskPage, error) {
	scan := o.scan()
	seen := cur.seen()
	var lo, hi int64
	if len(seen) == 0 {
		lo, hi = 0, int64(scan)-1
	} else {
		lo, hi = max(0, cur.Pos-slack), cur.Pos+int64(scan+cursorAnchors)
	}
	window, length, err := in.store.ReadyWindow(ctx, conn, o.place, lo, hi)
	if err != nil {
		return nil, err
	}
	page := &TaskPage{Total: length}
	start, found := anchored(window, seen)
	if !found && len(seen) > 0 && lo > 0 {
		// Consumed beyond the window: look further down next time.
		cur.Pos = lo
		page.Next = cur.encode()
		return page, nil
	}
	var cand []string
	for _, id := range window[start:] {
		if !seen.has(id) {
			cand = append(cand, id)
		}
	}
	truncated := len(cand) > scan
	cand = cand[:min(len(cand), scan)]
	views, used, read, err := in.judge(ctx, conn, o, cand, buckets.InReady)
	if err != nil {
		return nil, err
	}
	page.Tasks, page.BytesRead = views, read
	full := int64(len(window)) == hi-lo+1
	if used == len(cand) && !truncated && !full {
		return page, nil // read to the end of the list
	}
	if used == 0 {
		// The anchors are at the window's end (pushed back to the pop end
		// meanwhile): go on after the window.
		cur.Pos = lo + int64(len(window)) - 1
		page.Next = cur.encode()
		return page, nil
	}
	j := indexOf(window, cand[used-1])
	page.Next = cursor{Seen: seenOf(cand[:used]), Pos: lo + int64(j)}.encode()
	return page, nil
}

// listScheduled walks queue q's buckets in due order: the bucket index
// from the cursor's bucket (one ZRANGEBYSCORE, at most maxVisits members
// of any queue), the windows of up to maxVisits of q's buckets in one
// MULTI/EXEC, then one MGET of the records.
func (in *laneInspector) listScheduled(ctx context.Context, conn redis.Conn, o *ListOptions, cur cursor) (*TaskPage, error) {
	total, err := in.total(ctx, conn, &o.Filter)
	if err != nil {
		return nil, err
	}
	page := &TaskPage{Total: total}
	scan := o.scan()
	ats, lastTs, more, err := in.store.BucketTimes(ctx, conn, o.place, cur.Ts, maxVisits)
	if err != nil {
		return nil, err
	}
	if cur.Done && len(ats) > 0 && ats[0].Ts == cur.Ts {
		ats = ats[1:]
	}
	if len(ats) > scan {
		// Each bucket holds at least one id: scan of them fill the page.
		ats, more = ats[:scan], true
	}
	times := make([]int64, len(ats))
	for i := range ats {
		times[i] = ats[i].Ts
	}
	if len(times) == 0 && more {
		// None of q's buckets among the index members read. Those all lie
		// at or after the cursor's time and at or before lastTs; q may
		// still have a bucket at lastTs, past the members read.
		if lastTs > cur.Ts {
			page.Next = cursor{Ts: lastTs}.encode()
			return page, nil
		}
		// Every member read is at the cursor's time (many queues with a
		// bucket at one time): look for q's directly, then move on.
		ok := false
		if !cur.Done {
			if ok, err = in.store.BucketIndexed(ctx, conn, o.place, cur.Ts); err != nil {
				return nil, err
			}
		}
		if !ok {
			page.Next = cursor{Ts: cur.Ts + 1}.encode()
			return page, nil
		}
		times, ats = []int64{cur.Ts}, nil
	}
	if len(times) == 0 {
		return page, nil
	}
	seen := cur.seen()
	resume := !cur.Done && len(seen) > 0 && times[0] == cur.Ts
	ranges := make([]buckets.BucketRange, len(times))
	for i, ts := range times {
		ranges[i] = buckets.BucketRange{Ts: ts, Lo: 0, Hi: int64(scan) - 1}
		if ats != nil {
			ranges[i].At = &ats[i]
		}
	}
	if resume {
		ranges[0].Lo, ranges[0].Hi = max(0, cur.Pos-slack), cur.Pos+int64(scan+cursorAnchors)
	}
	windows, err := in.store.BucketWindows(ctx, conn, o.place, ranges)
	if err != nil {
		return nil, err
	}
	type at struct {
		b int // index in times
		i int // index in its window
	}
	var cand []string
	var where []at
	for b, w := range windows {
		if len(cand) >= scan {
			break
		}
		start := 0
		if b == 0 && resume {
			s, found := anchored(w, seen)
			if !found && ranges[0].Lo > 0 {
				cur.Pos = ranges[0].Lo
				page.Next = cur.encode()
				return page, nil
			}
			start = s
		}
		for i := start; i < len(w) && len(cand) < scan; i++ {
			if b == 0 && resume && seen.has(w[i]) {
				continue
			}
			cand = append(cand, w[i])
			where = append(where, at{b, i})
		}
	}
	views, used, read, err := in.judge(ctx, conn, o, cand, buckets.InBucket)
	if err != nil {
		return nil, err
	}
	page.Tasks, page.BytesRead = views, read
	if used == 0 {
		// Nothing read: every visited bucket was empty after its anchors.
		if len(times) < maxVisits && !more {
			return page, nil
		}
		page.Next = cursor{Ts: times[len(times)-1], Done: true}.encode()
		return page, nil
	}
	last := where[used-1]
	w, r := windows[last.b], ranges[last.b]
	exhausted := int64(len(w)) < r.Hi-r.Lo+1 && last.i == len(w)-1
	if exhausted {
		if last.b == len(times)-1 && !more {
			return page, nil // the last bucket of the index, read to its end
		}
		page.Next = cursor{Ts: times[last.b], Done: true}.encode()
		return page, nil
	}
	var mine []string // the ids read in the cursor's bucket
	for k := 0; k < used; k++ {
		if where[k].b == last.b {
			mine = append(mine, cand[k])
		}
	}
	page.Next = cursor{Ts: times[last.b], Seen: seenOf(mine), Pos: r.Lo + int64(last.i)}.encode()
	return page, nil
}

// listRunning walks the pending sets of the registered workers, by worker
// id then lease deadline: SMEMBERS w, then one ZRANGEBYSCORE per worker
// visited (at most maxVisits), then one MGET of the records.
func (in *laneInspector) listRunning(ctx context.Context, conn redis.Conn, o *ListOptions, cur cursor) (*TaskPage, error) {
	total, err := in.total(ctx, conn, &o.Filter)
	if err != nil {
		return nil, err
	}
	page := &TaskPage{Total: total}
	workers, err := in.store.WorkerIDs(ctx, conn)
	if err != nil {
		return nil, err
	}
	scan := o.scan()
	var cand []string
	var keys []skey
	visited, lastVisited, more := 0, "", false
	for _, w := range workers {
		if w < cur.Worker || (w == cur.Worker && cur.Done) {
			continue
		}
		if len(cand) >= scan || visited == maxVisits {
			more = true
			break
		}
		visited, lastVisited = visited+1, w
		min, extra, skip := "-inf", 0, noSkip
		if w == cur.Worker && cur.Score != nil && len(cur.Anchors) == 1 {
			min, extra, skip = strconv.FormatInt(*cur.Score, 10), resumeExtra(cur), skipUpTo(*cur.Score, cur.Anchors[0], false)
		}
		want := scan - len(cand)
		fetch := want + extra + 1
		es, err := in.store.PendingPage(ctx, conn, w, min, 0, fetch)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, e := range es {
			if skip(e) {
				continue
			}
			if n == want {
				more = true
				break
			}
			cand = append(cand, e.ID)
			keys = append(keys, skey{w, e.Score})
			n++
		}
		if len(es) == fetch {
			more = true
			if n == 0 {
				// Every member read was of the cursor's score and read
				// before (more of them were added): read further next time.
				c := cur
				c.Pos += int64(len(es))
				page.Next = c.encode()
				return page, nil
			}
		}
	}
	if len(cand) == 0 && more {
		page.Next = cursor{Worker: lastVisited, Done: true}.encode()
		return page, nil
	}
	return in.scoredPage(ctx, conn, o, page, cand, keys, more, cur)
}

// listDead walks the dead letters newest first: one ZREVRANGEBYSCORE, then
// one MGET of the records.
func (in *laneInspector) listDead(ctx context.Context, conn redis.Conn, o *ListOptions, cur cursor) (*TaskPage, error) {
	total, err := in.total(ctx, conn, &o.Filter)
	if err != nil {
		return nil, err
	}
	page := &TaskPage{Total: total}
	scan := o.scan()
	maxScore, extra, skip := "+inf", 0, noSkip
	if cur.Score != nil && len(cur.Anchors) == 1 {
		maxScore, extra, skip = strconv.FormatInt(*cur.Score, 10), resumeExtra(cur), skipUpTo(*cur.Score, cur.Anchors[0], true)
	}
	fetch := scan + extra + 1
	es, err := in.store.DeadPage(ctx, conn, maxScore, 0, fetch)
	if err != nil {
		return nil, err
	}
	var cand []string
	var keys []skey
	more := len(es) == fetch
	for _, e := range es {
		if skip(e) {
			continue
		}
		if len(cand) == scan {
			more = true
			break
		}
		cand = append(cand, e.ID)
		keys = append(keys, skey{"", e.Score})
	}
	if len(cand) == 0 && more {
		// As in listRunning: all of the cursor's score, read before.
		cur.Pos += int64(len(es))
		page.Next = cur.encode()
		return page, nil
	}
	return in.scoredPage(ctx, conn, o, page, cand, keys, more, cur)
}

// skey is where a member of a sorted-set walk is: its worker (running) and
// score.
type skey struct {
	w     string
	score int64
}

func noSkip(buckets.Scored) bool { return false }

// skipUpTo skips the members of score s already read: those up to anchor
// in the set's order of equal scores (byte order, reversed for a
// ZREVRANGEBYSCORE walk).
func skipUpTo(s int64, anchor string, rev bool) func(buckets.Scored) bool {
	return func(e buckets.Scored) bool {
		if e.Score != s {
			return false
		}
		if rev {
			return e.ID >= anchor
		}
		return e.ID <= anchor
	}
}

// resumeExtra is how many more members a resumed sorted-set walk reads
// than it may return: the members of the cursor's score read so far
// (which the skip drops; a LIMIT offset would skip members that stayed
// when some of those left), and a margin for members of that score
// added meanwhile. Runs of one score are short: the tasks of one worker
// claimed, or buried, in the same millisecond.
func resumeExtra(cur cursor) int { return int(cur.Pos) + cursorAnchors }

// scoredPage judges the candidates of a sorted-set walk and builds the
// cursor after the last one used: its worker and score, its id as the
// anchor, and how many members of that score were read up to it.
func (in *laneInspector) scoredPage(ctx context.Context, conn redis.Conn, o *ListOptions, page *TaskPage, cand []string, keys []skey, more bool, cur cursor) (*TaskPage, error) {
	views, used, read, err := in.judge(ctx, conn, o, cand, buckets.InRecord)
	if err != nil {
		return nil, err
	}
	page.Tasks, page.BytesRead = views, read
	if used == 0 || (used == len(cand) && !more) {
		return page, nil
	}
	k := keys[used-1]
	n := int64(0)
	i := used - 1
	for ; i >= 0 && keys[i] == k; i-- {
		n++
	}
	if i < 0 && cur.Score != nil && *cur.Score == k.score && cur.Worker == k.w {
		n += cur.Pos // the run of equal scores began on earlier pages
	}
	score := k.score
	page.Next = cursor{Worker: k.w, Score: &score, Anchors: []string{cand[used-1]}, Pos: n}.encode()
	return page, nil
}
func indexOf(xs []string, x string) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	return -1
}
