package buckets

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/bucketq/bucketq/internal/safetext"
)

// Workflows: chains and groups.
//
// A chain is a sequence of steps, each a task. Only the step that can run
// exists as a task; it carries the steps after it in its record (the flow
// section, see Flow), and the transaction that records its success also
// writes and places the next step, with an id derived from the chain's
// (FlowStepID). That transaction commits at most once per run that still
// owns the record (the record is WATCHed by every finish), so a step that
// runs twice still writes its successor once, and no read of the
// successor is needed: a chain step finishes in one round trip as any
// task does.
//
// A group is a set of members, all enqueued at once, and a callback
// template. The group's hash ([Keys.Workflow]) counts the members that
// reached a final state and keeps their outcomes; every member's final
// transition WATCHes it, reads the counters (flowRead) and updates them
// (flowWrites), and the one that makes the group complete writes the
// callback task, once: a concurrent finish of another member changes the
// hash and makes EXEC fail and read again.

// FlowKind says what part a task plays in a workflow.
type FlowKind byte

// Flow kinds.
const (
	FlowChain    FlowKind = 1 // a step of a chain
	FlowMember   FlowKind = 2 // a member of a group
	FlowCallback FlowKind = 3 // the callback of a group
)

func (k FlowKind) String() string {
	switch k {
	case FlowChain:
		return "chain"
	case FlowMember, FlowCallback:
		return "group"
	}
	return fmt.Sprintf("FlowKind(%d)", byte(k))
}

// Limits on workflows, checked by ValidateFlow and by the writes that
// carry results.
const (
	// MaxChainSteps bounds the steps of a chain.
	MaxChainSteps = 64
	// MaxGroupMembers bounds the members of a group.
	MaxGroupMembers = 1000
	// MaxFlowCarry bounds a result carried by value: into the next step
	// of a chain, or into a group's outcomes. A larger one is carried as
	// a reference (the task id; its result is kept for the result
	// retention under [Keys.Result]).
	MaxFlowCarry = 64 << 10
	// MaxFlowInput bounds all results carried into a group's callback
	// together; the results past it are carried as references.
	MaxFlowInput = 1 << 20
	// MaxFlowIDLen bounds a workflow id, so that the ids derived from it
	// stay within 128 bytes.
	MaxFlowIDLen = 100
	// MaxWriteBytes bounds the tasks one transaction of a caller writes,
	// counted as their payloads, types, queues and metadata: a chain's
	// steps (each step record carries the ones after it), a group's
	// members and callback, a batch of several tasks.
	MaxWriteBytes = 4 << 20
)

// Group policies: what a dead (or cancelled) member does to the group.
const (
	// PolicyFail: the group fails, and its callback is not enqueued while
	// a member is dead; retrying the dead member from the dead letters
	// (it then succeeds) completes the group.
	PolicyFail = "fail"
	// PolicyContinue: the callback runs once every member is final,
	// whatever their outcomes, and lists them.
	PolicyContinue = "continue"
)

// FlowStep is a step of a chain not yet enqueued, or a group's callback
// template: what its task will be.
type FlowStep struct {
	Queue       string
	Type        string
	Payload     []byte
	MaxAttempts int
	TimeoutMs   int64
	DelayMs     int64 // due this long after its predecessor succeeded
	PassResult  bool  // the predecessor's result becomes Flow.Input
	Metadata    map[string]string
	Priority    int // the step's level in its queue (Record.Priority)
}

// Flow is a task's part in a workflow (record section 6, required: a
// worker that does not know it refuses the record instead of running a
// step without writing its successor).
type Flow struct {
	ID        string   // the workflow's id
	Kind      FlowKind // chain step, group member or group callback
	Step      int      // index of the step in the chain, or of the member
	Total     int      // steps of the chain, members of the group
	Cancelled bool     // chain: cancelled while this step ran or was dead; no successor
	// Next are the chain's steps after this one (chain only).
	Next []FlowStep
	// Input is what the workflow gave this task: the predecessor's
	// result (chain, when asked for and at most MaxFlowCarry bytes), or
	// the members' outcomes, a JSON array of FlowOutcome (callback).
	Input []byte
}

// FlowOutcome is a group member's outcome, as kept in the group's hash and
// given to the callback.
type FlowOutcome struct {
	Index  int    `json:"index"`
	ID     string `json:"id"`
	State  string `json:"state"` // "done", "dead" or "cancelled"
	Error  string `json:"error,omitempty"`
	Result []byte `json:"result,omitempty"`
	// ResultRef: the result was too large to carry; read it by the id
	// (kept for the result retention).
	ResultRef bool `json:"result_ref,omitempty"`
}

// FlowStepID is the id of step i of chain (or member i of group) id.
func FlowStepID(id string, i int) string { return id + "~" + strconv.Itoa(i) }

// FlowOfStepID returns the workflow whose step or member id would be, when
// id is "<flow>~<i>" (FlowStepID) with flow a valid workflow id and i
// below the larger of MaxChainSteps and MaxGroupMembers.
func FlowOfStepID(id string) (string, bool) {
	j := strings.LastIndexByte(id, '~')
	if j <= 0 {
		return "", false
	}
	n, err := strconv.Atoi(id[j+1:])
	if err != nil || n < 0 || n >= max(MaxChainSteps, MaxGroupMembers) || strconv.Itoa(n) != id[j+1:] {
		return "", false
	}
	if ValidateFlowID(id[:j]) != nil {
		return "", false
	}
	return id[:j], true
}

// FlowCallbackID is the id of group id's callback task.
func FlowCallbackID(id string) string { return id + "~cb" }

// Workflow is workflow id's hash: HASH with the fields Flow* below and,
// for a group, "o:<i>" per member that reached a final state (its
// FlowOutcome, JSON).
func (k Keys) Workflow(id string) string { return k.prefix + "wf:" + id }

// Fields of a workflow's hash.
const (
	FlowFieldKind      = "kind"      // "chain" or "group"
	FlowFieldTotal     = "n"         // steps or members
	FlowFieldCreated   = "created"   // Unix ms
	FlowFieldPolicy    = "policy"    // group: PolicyFail or PolicyContinue
	FlowFieldCallback  = "cb"        // group: the callback template, an encoded Record
	FlowFieldFinal     = "final"     // group: members in a final state
	FlowFieldOK        = "ok"        // group: members done
	FlowFieldFired     = "fired"     // group: the callback's id, once enqueued
	FlowFieldCancelled = "cancelled" // "1" once cancelled
	FlowFieldEnded     = "ended"     // chain: Unix ms the last step succeeded
	flowOutcomePrefix  = "o:"
)

// flow section flags.
const (
	flowCancelled = 1
	flowHasInput  = 2
)

func (f *Flow) encode() []byte {
	var b []byte
	flags := byte(0)
	if f.Cancelled {
		flags |= flowCancelled
	}
	if len(f.Input) > 0 {
		flags |= flowHasInput
	}
	b = append(b, byte(f.Kind), flags)
	b = binary.AppendUvarint(b, uint64(f.Step))
	b = binary.AppendUvarint(b, uint64(f.Total))
	b = appendLen(b, f.ID)
	if len(f.Input) > 0 {
		b = appendLen(b, f.Input)
	}
	b = binary.AppendUvarint(b, uint64(len(f.Next)))
	for _, s := range f.Next {
		b = appendLen(b, s.Queue)
		b = appendLen(b, s.Type)
		b = appendLen(b, s.Payload)
		b = binary.AppendUvarint(b, uint64(max(s.MaxAttempts, 0)))
		b = binary.AppendUvarint(b, uint64(max(s.TimeoutMs, 0)))
		b = binary.AppendUvarint(b, uint64(max(s.DelayMs, 0)))
		// One byte: bit 0 passes the result, the bits above hold a
		// level above 1 (Record.Priority), 0 for level 1.
		pass := byte(0)
		if s.PassResult {
			pass = 1
		}
		if s.Priority > 1 {
			pass |= byte(s.Priority) << 1
		}
		b = append(b, pass)
		m := (&Record{Metadata: s.Metadata}).encodeMetadata()
		b = appendLen(b, m)
	}
	return b
}

// appendLen appends v's length as an unsigned varint, then v: the
// length-prefixed form of every string and byte field of a record and
// its sections.
func appendLen[T string | []byte](b []byte, v T) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// decodeFlow parses a flow section's body; nil when it is not one encode
// made (every field in range, one encoding per value).
func decodeFlow(body []byte) *Flow {
	if len(body) < 2 {
		return nil
	}
	f := &Flow{Kind: FlowKind(body[0])}
	flags := body[1]
	if f.Kind < FlowChain || f.Kind > FlowCallback || flags&^(flowCancelled|flowHasInput) != 0 {
		return nil
	}
	f.Cancelled = flags&flowCancelled != 0
	d := decoder{b: body[2:]}
	step, total := d.uvarint(), d.uvarint()
	if d.err || total == 0 || step >= total || total > MaxGroupMembers {
		return nil
	}
	f.Step, f.Total = int(step), int(total)
	f.ID = d.str()
	if flags&flowHasInput != 0 {
		f.Input = d.bytes()
		if len(f.Input) == 0 {
			return nil
		}
	}
	n := d.uvarint()
	if d.err || f.ID == "" || len(f.ID) > MaxFlowIDLen {
		return nil
	}
	switch {
	case f.Kind == FlowChain && (total > MaxChainSteps || n != total-step-1):
		return nil
	case f.Kind != FlowChain && (n != 0 || f.Cancelled):
		return nil
	case f.Kind == FlowCallback && step != 0:
		return nil
	}
	for range n {
		s := FlowStep{Queue: d.name(), Type: d.name(), Payload: d.bytes()}
		ma, to, delay := d.uvarint(), d.uvarint(), d.uvarint()
		if ma > 1<<31 || to > 1<<53 || delay > 1<<53 {
			return nil
		}
		s.MaxAttempts, s.TimeoutMs, s.DelayMs = int(ma), int64(to), int64(delay)
		if len(d.b) == 0 {
			return nil
		}
		lvl := int(d.b[0] >> 1)
		if lvl == 1 || lvl > MaxLevel {
			return nil
		}
		s.Priority = lvl
		s.PassResult = d.b[0]&1 == 1
		d.b = d.b[1:]
		m := d.bytes()
		if d.err {
			return nil
		}
		if len(m) > 0 {
			if m[0] != sectionMetadata {
				return nil
			}
			md := decoder{b: m[1:]}
			mb := md.bytes()
			if md.err || len(md.b) != 0 {
				return nil
			}
			if s.Metadata = decodeMetadata(mb); s.Metadata == nil {
				return nil
			}
		}
		f.Next = append(f.Next, s)
	}
	if d.err || len(d.b) != 0 {
		return nil
	}
	return f
}

// ValidateFlowID checks a workflow id: 1 to MaxFlowIDLen printable ASCII
// bytes without spaces.
func ValidateFlowID(id string) error {
	if id == "" || len(id) > MaxFlowIDLen {
		return fmt.Errorf("workflow id %s: want 1 to %d bytes: %w", safetext.Quote(id), MaxFlowIDLen, ErrInvalid)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("workflow id %s: byte %d is %q; want printable ASCII without spaces: %w", safetext.Quote(id), i, c, ErrInvalid)
		}
	}
	return nil
}

// step returns the record of step s as the successor of r (which
// succeeded at now), with id, flow and input set.
func (s FlowStep) record(id string, flow *Flow, now int64) *Record {
	return &Record{
		ID: id, Queue: s.Queue, Type: s.Type, Payload: s.Payload, State: StateWaiting,
		MaxAttempts: max(s.MaxAttempts, 1), TimeoutMs: max(s.TimeoutMs, 1),
		Created: now, Due: max(now+s.DelayMs, 1), Metadata: s.Metadata, Flow: flow, Priority: s.Priority,
	}
}

// StepOf returns the FlowStep that makes a record like r (for Validate
// and for the chain's steps after the first).
func StepOf(r *Record, delayMs int64, pass bool) FlowStep {
	return FlowStep{Queue: r.Queue, Type: r.Type, Payload: r.Payload, MaxAttempts: r.MaxAttempts,
		TimeoutMs: r.TimeoutMs, DelayMs: delayMs, PassResult: pass, Metadata: r.Metadata, Priority: r.Priority}
}

// groupView is a group's hash as one transaction read it (flowRead) and
// changed it so far (flowWrites): the transactions that bury several
// members of one group at once see their own changes.
type groupView struct {
	key       string
	total     int
	policy    string
	callback  []byte
	final, ok int
	fired     string
	cancelled bool
	old       map[int]string       // member index → state of its kept outcome ("" none)
	outcomes  map[int]*FlowOutcome // outcomes written by this transaction, and every kept one once loaded
	loaded    bool
}

// FlowViews is the per-transaction memory of the groups a transaction
// read; a transaction attempt makes a new one.
type FlowViews map[string]*groupView

// flowRead reads, inside a transaction, what the final transition of
// record r needs to know about its workflow: for a group member, WATCH
// wf:<group>, then HMGET of its counters and HGET of the member's kept
// outcome (and HGETALL when this transition may complete the group). It
// reads nothing for other tasks. views carries what earlier records of
// the same transaction read and wrote.
func (s *Store) flowRead(tx flowReader, r *Record, views FlowViews) error {
	if r == nil || r.Flow == nil || r.Flow.Kind != FlowMember {
		return nil
	}
	v := views[r.Flow.ID]
	key := s.Keys.Workflow(r.Flow.ID)
	if v == nil {
		if err := tx.Watch(key); err != nil {
			return err
		}
		reps, err := valuesOf(tx.Do("HMGET", key, FlowFieldTotal, FlowFieldPolicy, FlowFieldCallback,
			FlowFieldFinal, FlowFieldOK, FlowFieldFired, FlowFieldCancelled))
		if err != nil {
			return err
		}
		v = &groupView{key: key, old: map[int]string{}, outcomes: map[int]*FlowOutcome{}}
		str := func(i int) string { b, _ := reps[i].([]byte); return string(b) }
		v.total, _ = strconv.Atoi(str(0))
		v.policy = str(1)
		v.callback, _ = reps[2].([]byte)
		v.final, _ = strconv.Atoi(str(3))
		v.ok, _ = strconv.Atoi(str(4))
		v.fired = str(5)
		v.cancelled = str(6) != ""
		views[r.Flow.ID] = v
	}
	if _, seen := v.old[r.Flow.Step]; !seen && !v.loaded {
		b, err := bytesOf(tx.Do("HGET", key, flowOutcomePrefix+strconv.Itoa(r.Flow.Step)))
		if err != nil {
			return err
		}
		v.old[r.Flow.Step] = outcomeState(b)
	}
	if v.total > 0 && v.total-v.final <= 1 && !v.loaded {
		all, err := valuesOf(tx.Do("HGETALL", key))
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(all); i += 2 {
			f, _ := all[i].([]byte)
			idx, ok := strings.CutPrefix(string(f), flowOutcomePrefix)
			if !ok {
				continue
			}
			n, err := strconv.Atoi(idx)
			b, _ := all[i+1].([]byte)
			var o FlowOutcome
			if err != nil || json.Unmarshal(b, &o) != nil {
				continue
			}
			if _, mine := v.outcomes[n]; !mine {
				// This transaction's own outcomes are newer.
				v.outcomes[n] = &o
				v.old[n] = o.State
			}
		}
		v.loaded = true
		if _, ok := v.old[r.Flow.Step]; !ok {
			v.old[r.Flow.Step] = ""
		}
	}
	r.gv = v
	return nil
}

func outcomeState(b []byte) string {
	if b == nil {
		return ""
	}
	var o FlowOutcome
	if json.Unmarshal(b, &o) != nil {
		return ""
	}
	return o.State
}

// flowReader is what flowRead needs of a transaction: watch and read.
type flowReader interface {
	Watch(keys ...string) error
	Do(name string, args ...interface{}) (interface{}, error)
}

func valuesOf(rep interface{}, err error) ([]interface{}, error) {
	if err != nil {
		return nil, err
	}
	if e := asError(rep); e != nil {
		return nil, e
	}
	vs, ok := rep.([]interface{})
	if !ok {
		return nil, fmt.Errorf("workflow hash: unexpected reply %T: %w", rep, ErrMalformed)
	}
	return vs, nil
}

func bytesOf(rep interface{}, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	if e := asError(rep); e != nil {
		return nil, e
	}
	b, _ := rep.([]byte)
	return b, nil
}

// flowWrites queues what the final transition of record r (done, dead or
// cancelled, in the same MULTI) writes for its workflow:
//
//	chain step, done, not cancelled, not last:
//	  SET t:<next> (the next step: id FlowStepID, the result as its
//	  input when asked for); its placement (LPUSH q:<q> + tokens, or
//	  RPUSH bucket + ZADD sched + wake + HINCRBY scheduled); SADD queues
//	chain step, last done, or cancelled:
//	  HSET wf:<chain> ended now (and cancelled 1, a step cancelled);
//	  EXPIRE wf:<chain> FlowTTL
//	group member (flowRead read the group first):
//	  HSET wf:<g> o:<i> outcome; HINCRBY wf:<g> final/ok as they change;
//	  and when the group is complete (every member final, and all done
//	  under PolicyFail), not cancelled and not yet fired:
//	  SET t:<g~cb> (the callback, the outcomes as its input) and its
//	  placement; HSET wf:<g> fired <id>; EXPIRE wf:<g> FlowTTL
//
// It writes nothing for other tasks, nor for a group member whose group
// was not read (which no final transition does: see flowRead's callers).
func (s *Store) flowWrites(tx queuer, r *Record) {
	r.Spawned = nil
	f := r.Flow
	if f == nil {
		return
	}
	switch f.Kind {
	case FlowChain:
		key := s.Keys.Workflow(f.ID)
		if r.State == StateDone && !f.Cancelled && len(f.Next) > 0 {
			next := f.Next[0]
			nf := &Flow{ID: f.ID, Kind: FlowChain, Step: f.Step + 1, Total: f.Total, Next: f.Next[1:]}
			if next.PassResult && len(r.Result) <= MaxFlowCarry {
				nf.Input = r.Result
			}
			nr := next.record(FlowStepID(f.ID, f.Step+1), nf, r.Finished)
			tx.Queue("SET", s.Keys.Task(nr.ID), nr.Encode())
			tx.Queue("SADD", s.Keys.Queues(), nr.Queue)
			s.place(tx, nr, r.Finished, false)
			r.Spawned = append(r.Spawned, nr)
			return
		}
		if r.State == StateDone || r.State == StateCancelled {
			if r.State == StateCancelled {
				// Its step cancelled by itself (Cancel, the inspector):
				// the chain is cancelled as CancelFlow would say.
				tx.Queue("HSET", key, FlowFieldCancelled, 1)
			}
			tx.Queue("HSET", key, FlowFieldEnded, r.Finished)
			s.expireFlow(tx, key)
		}
	case FlowMember:
		v := r.gv
		if v == nil || v.total == 0 || (r.State != StateDone && r.State != StateDead && r.State != StateCancelled) {
			return
		}
		r.gv = nil
		o := &FlowOutcome{Index: f.Step, ID: r.ID, State: r.State.String()}
		if r.State == StateDead {
			o.Error = truncate(r.LastError, 512)
		}
		if r.State == StateDone && len(r.Result) > 0 {
			if len(r.Result) <= MaxFlowCarry {
				o.Result = r.Result
			} else {
				o.ResultRef = true
			}
		}
		b, _ := json.Marshal(o)
		tx.Queue("HSET", v.key, flowOutcomePrefix+strconv.Itoa(f.Step), b)
		old := v.old[f.Step]
		if old == "" {
			tx.Queue("HINCRBY", v.key, FlowFieldFinal, 1)
			v.final++
		}
		if o.State == "done" && old != "done" {
			tx.Queue("HINCRBY", v.key, FlowFieldOK, 1)
			v.ok++
		}
		v.old[f.Step] = o.State
		v.outcomes[f.Step] = o
		if v.cancelled && v.final >= v.total && v.fired == "" {
			s.expireFlow(tx, v.key) // cancelled, and every member ended
			return
		}
		if v.fired != "" || v.cancelled || !v.loaded || v.final < v.total {
			return
		}
		if v.policy != PolicyContinue && v.ok < v.total {
			return // failed: a member retried from the dead letters may complete it
		}
		if cb := s.fire(tx, v, f.ID, r.Finished); cb != nil {
			r.Spawned = append(r.Spawned, cb)
		}
	}
}

// fire queues the writes of group id's callback, and returns its record
// (nil when the group has none).
func (s *Store) fire(tx queuer, v *groupView, id string, now int64) *Record {
	tmpl, err := DecodeRecord(FlowCallbackID(id), v.callback)
	if err != nil {
		// No callback was given (or its template is unreadable): the
		// group completes without one.
		tx.Queue("HSET", v.key, FlowFieldFired, "-")
		v.fired = "-"
		s.expireFlow(tx, v.key)
		return nil
	}
	idx := make([]int, 0, len(v.outcomes))
	for i := range v.outcomes {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	outs := make([]FlowOutcome, 0, len(idx))
	carried := 0
	for _, i := range idx {
		o := *v.outcomes[i]
		if len(o.Result) > 0 && carried+len(o.Result) > MaxFlowInput {
			o.Result, o.ResultRef = nil, true
		}
		carried += len(o.Result)
		outs = append(outs, o)
	}
	in, _ := json.Marshal(outs)
	tmpl.Flow = &Flow{ID: id, Kind: FlowCallback, Step: 0, Total: v.total, Input: in}
	tmpl.State = StateWaiting
	tmpl.Created = now
	tmpl.Due = max(now+max(tmpl.Due, 0), 1) // the template's Due is its delay
	tx.Queue("SET", s.Keys.Task(tmpl.ID), tmpl.Encode())
	tx.Queue("SADD", s.Keys.Queues(), tmpl.Queue)
	s.place(tx, tmpl, now, false)
	tx.Queue("HSET", v.key, FlowFieldFired, tmpl.ID)
	v.fired = tmpl.ID
	s.expireFlow(tx, v.key)
	return tmpl
}

// expireFlow gives a workflow's hash the retention of done tasks.
func (s *Store) expireFlow(tx queuer, key string) {
	if s.FlowTTL > 0 {
		tx.Queue("EXPIRE", key, s.FlowTTL)
	} else {
		tx.Queue("EXPIRE", key, 1)
	}
}

// FlowReads reports whether r's final transition must read its workflow
// first (a group member): it cannot finish under a held watch.
func (r *Record) FlowReads() bool { return r.Flow != nil && r.Flow.Kind == FlowMember }
