package buckets

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync/atomic"
	"unicode/utf8"

	"github.com/bucketq/bucketq/internal/safetext"
)

// State is where a task is in its life. The states a task record can hold
// are below; "scheduled" and "ready" are both StateWaiting in the record
// and told apart by where the id is (see Lookup).
type State byte

// Task states. A record stores a state as its code (recordStates).
const (
	StateWaiting   State = 'w' // in a bucket or a ready list, not yet run
	StateRetry     State = 'r' // failed, waiting in a bucket or ready list to run again
	StateRunning   State = 'a' // claimed by a worker, in its pending set
	StateDone      State = 'd' // succeeded; kept for the done retention
	StateDead      State = 'x' // in the dead letters
	StateCancelled State = 'c' // cancelled before it ran; kept for the done retention
)

func (s State) String() string {
	switch s {
	case StateWaiting:
		return "waiting"
	case StateRetry:
		return "retrying"
	case StateRunning:
		return "running"
	case StateDone:
		return "done"
	case StateDead:
		return "dead"
	case StateCancelled:
		return "cancelled"
	}
	return fmt.Sprintf("State(%d)", byte(s))
}

// Record is a task record. Times are Unix milliseconds; zero means unset.
type Record struct {
	ID         string // not encoded: it is in the key
	Queue      string
	Type       string
	Payload    []byte
	State      State
	Attempts   int // handler runs that failed
	Recoveries int // times its worker died or lost the lease while running it
	Runs       int // times it was claimed; names the current run for ack
	Snoozes    int // times its handler snoozed it (not failures)
	// Priority is the task's level in its queue: 1 (or 0, read as 1)
	// runs first, MaxLevel last. A level above 1 is stored in the
	// record's trailing sections and names the lists the task waits in
	// (Place).
	Priority    int
	MaxAttempts int   // handler runs allowed before it goes to the dead letters
	TimeoutMs   int64 // handler time limit
	Created     int64
	Due         int64
	Started     int64 // last claim
	Finished    int64 // done, dead or cancelled
	Deadline    int64 // lease deadline of the current run
	Worker      string
	LastError   string
	// Metadata is small string pairs that travel with the task, for the
	// producer's trace context and the like; nil when none. Stored in
	// the record's trailing sections, see Encode.
	Metadata map[string]string

	// extra holds the trailing sections this release does not know (the
	// informational ones of a later release), as read, so that rewriting
	// such a record keeps them.
	extra [][]byte // whole sections, tag byte first

	// Optional fields, stored in the record's trailing sections (see
	// Encode) when set.

	// Periodic is the name of the periodic entry whose firing this task
	// is ("" for other tasks).
	Periodic string
	// SkipIfRunning: the claim skips (cancels) this firing while the
	// previous run of its entry is still running.
	SkipIfRunning bool
	// HoldsSlot: the run holds a slot of its queue's concurrency limit
	// (Keys.Slots); every transition out of running gives it back.
	HoldsSlot bool

	// Unique is the unique key the task holds (the name after "u:", see
	// [Keys.Unique]); "" for none. The key is held while this record is
	// waiting, retrying or running and names it.
	Unique string
	// UniqueTTL is the unique key's lifetime in seconds; 0 holds it until
	// the task ends, and then the final transition deletes it.
	UniqueTTL int64
	// ReplyTo names the queue ([ReplyQueuePrefix]) into which every final
	// transition pushes a reply; "" for none.
	ReplyTo string
	// ExpireAt is when the task stops being worth starting (Unix ms; 0:
	// never): a claim after it buries the task as expired instead.
	ExpireAt int64
	// Key is the task's flow-control key within its queue (a tenant, say;
	// a ValidName, "" for none): it waits in its key's list (KeyPlace),
	// taken round-robin with the queue's other keys, and counts against
	// the queue's per-key limits.
	Key string
	// HoldsKeySlot: the run holds a slot of its key's limit
	// (Keys.KeySlots); every transition out of running gives it back.
	HoldsKeySlot bool

	// Result is not stored in the record: Finish's decide sets it on a
	// Done outcome, and it is stored under [Keys.Result].
	Result []byte

	// Spawned is not stored: a final transition's writes set it to the
	// tasks they enqueue besides the record (a chain's next step, a
	// group's callback, a reply task), for the caller to report once the
	// transaction committed.
	Spawned []*Record

	// Progress is not stored in the record: Lookup reads it from
	// [Keys.Progress] for a task that has run; nil when none.
	Progress *Progress

	// Flow is the task's part in a workflow (workflow.go); nil for none.
	Flow *Flow
	gv   *groupView // its group as the transaction read it (flowRead)
}

// Limits on record fields, checked by Validate.
const (
	MaxTypeLen  = 256
	MaxErrorLen = 4096
	// MaxMetadata bounds the number of Metadata pairs, MaxMetadataKeyLen
	// a key's length and MaxMetadataBytes all keys and values together.
	MaxMetadata       = 32
	MaxMetadataKeyLen = 128
	MaxMetadataBytes  = 4096
)

// A record's first two bytes: the magic byte and the version of its
// encoding. There is one encoding, whose version byte is 4 (the number it
// had among the encodings tried before the first release, none of which
// is read). A later release that changes the encoding recognises a record
// of this one by these two bytes; DecodeRecord refuses a record of any
// other version with an error naming it.
const (
	recordMagic   = 'B'
	recordVersion = 4
)

// Record fields, by their bit in the record's presence mask (see Encode).
// Each is stored only when it differs from what its absence means, in this
// order.
const (
	fCreatedID   = 1 << iota // Created is the time in the id (IDTime): no bytes
	fDue                     // Due ≠ Created: the zigzag varint of Due − Created
	fCreated                 // Created otherwise, when not 0: a uvarint
	fQueue                   // Queue ≠ defaultQueue: length-prefixed
	fMaxAttempts             // MaxAttempts ≠ defaultMaxAttempts: a uvarint
	fTimeout                 // TimeoutMs ≠ defaultTimeoutMs: a uvarint
	fAttempts                // then, when not 0: uvarints
	fRecoveries
	fRuns
	fStarted
	fFinished
	fDeadline
	fWorker    // length-prefixed, when not ""
	fLastError // length-prefixed, when not ""
	fSections  // the trailing sections, after the type: their length, then them
	fKnown     = fSections<<1 - 1
)

// What a record means when it leaves a field out: the defaults of the
// engine that introduced the encoding. They are part of the format, so
// they stay these values whatever a later release's defaults become.
const (
	defaultQueue       = "default"
	defaultMaxAttempts = 25
	defaultTimeoutMs   = 30 * 60 * 1000
)

// recordStates are the states by their code in a record's first uvarint
// (its low 3 bits).
var recordStates = [...]State{StateWaiting, StateRetry, StateRunning, StateDone, StateDead, StateCancelled}

// Trailing section tags.
const (
	sectionMetadata = 'm' // uvarint count, then per pair (sorted by key) length-prefixed key and value
)

// More section tags. A field at its zero value is left out (no empty
// section is written), so each record has one encoding; sections are
// written in increasing tag order.
//
// A tag below 'a' is required: a decoder that does not know it refuses the
// record as malformed ("upgrade this worker"), so an older worker buries
// it saying why instead of running it without a field that changes what
// running means (a unique key to release, a reply to send, an overlap
// rule). A tag from 'a' up is informational (the metadata): an older
// decoder keeps its bytes and writes them back.
const (
	sectionPeriodic  = 1  // the periodic entry's name
	sectionFlags     = 2  // one byte of flags: flagSkipIfRunning, flagHoldsSlot
	sectionUnique    = 3  // Record.Unique
	sectionUniqueTTL = 4  // Record.UniqueTTL, an unsigned varint
	sectionReplyTo   = 5  // Record.ReplyTo
	sectionFlow      = 6  // Record.Flow (workflow.go)
	sectionSnoozes   = 7  // Record.Snoozes, an unsigned varint
	sectionPriority  = 8  // Record.Priority above 1, an unsigned varint
	sectionExpireAt  = 9  // Record.ExpireAt, an unsigned varint
	sectionKey       = 10 // Record.Key
)

const (
	flagSkipIfRunning = 1
	flagHoldsSlot     = 2
	flagHoldsKeySlot  = 4
)

// Encode returns the stored form of r: the magic byte 'B', the version
// (recordVersion), a uvarint of the mask of the fields stored (f* bits)
// shifted left by 3 and the state's code (recordStates) in the low 3 bits,
// those fields in bit order, the length-prefixed type, the trailing
// sections when there are any (their total length, then each a tag byte,
// a uvarint length and that many bytes; see sections), and the payload:
// the rest of the record, with no length. A field at what its absence
// means takes no byte: a task created with a generated id (IDTime), on
// the default queue with the default attempts and timeout, stores its
// state, its due time relative to its creation, its type and its payload,
// a header of 4 bytes plus the type and the due delta. A record is most of
// a task's memory.
func (r *Record) Encode() []byte {
	created, due := max(r.Created, 0), max(r.Due, 0)
	var mask uint64
	if t, ok := IDTime(r.ID); ok && created == t {
		mask |= fCreatedID
	} else if created > 0 {
		mask |= fCreated
	}
	if due != created {
		mask |= fDue
	}
	if r.Queue != defaultQueue {
		mask |= fQueue
	}
	maxAttempts, timeout := int64(max(r.MaxAttempts, 0)), max(r.TimeoutMs, 0)
	if maxAttempts != defaultMaxAttempts {
		mask |= fMaxAttempts
	}
	if timeout != defaultTimeoutMs {
		mask |= fTimeout
	}
	counts := [...]int64{int64(r.Attempts), int64(r.Recoveries), int64(r.Runs), r.Started, r.Finished, r.Deadline}
	for i, v := range counts {
		if v > 0 {
			mask |= fAttempts << i
		}
	}
	if r.Worker != "" {
		mask |= fWorker
	}
	if r.LastError != "" {
		mask |= fLastError
	}
	sections := r.sections()
	size := 0
	for _, sec := range sections {
		size += len(sec)
	}
	if size > 0 {
		mask |= fSections
	}
	// The fields before the strings go to a buffer on the stack first, so
	// that the record is allocated at its exact length: a record is
	// written for every task, and room to spare would put many in a larger
	// allocator class.
	var hb [128]byte
	h := binary.AppendUvarint(hb[:0], mask<<3|uint64(stateCode(r.State)))
	if mask&fCreated != 0 {
		h = binary.AppendUvarint(h, uint64(created))
	}
	if mask&fDue != 0 {
		h = binary.AppendVarint(h, due-created)
	}
	if mask&fQueue != 0 {
		h = appendLen(h, r.Queue)
	}
	if mask&fMaxAttempts != 0 {
		h = binary.AppendUvarint(h, uint64(maxAttempts))
	}
	if mask&fTimeout != 0 {
		h = binary.AppendUvarint(h, uint64(timeout))
	}
	for i, v := range counts {
		if mask&(fAttempts<<i) != 0 {
			h = binary.AppendUvarint(h, uint64(v))
		}
	}
	strs := [...]string{r.Worker, r.LastError}
	n := 2 + len(h) + lenPrefixed(len(r.Type)) + len(r.Payload)
	for _, s := range strs {
		if s != "" {
			n += lenPrefixed(len(s))
		}
	}
	if size > 0 {
		n += lenPrefixed(size)
	}
	b := make([]byte, 0, n)
	b = append(b, recordMagic, recordVersion)
	b = append(b, h...)
	for _, s := range strs {
		if s != "" {
			b = appendLen(b, s)
		}
	}
	b = appendLen(b, r.Type)
	if size > 0 {
		b = binary.AppendUvarint(b, uint64(size))
		for _, sec := range sections {
			b = append(b, sec...)
		}
	}
	return append(b, r.Payload...)
}

// Place is where the task waits: its queue's list of its level and key
// (Place, KeyPlace).
func (r *Record) Place() string { return KeyPlace(Place(r.Queue, r.Priority), r.Key) }

// Level is the task's priority level, 1 to MaxLevel.
func (r *Record) Level() int { return max(r.Priority, 1) }

// stateCode is st's code in a record; 7, which the decoder refuses, for a
// state that is not one.
func stateCode(st State) int {
	for i, v := range recordStates {
		if v == st {
			return i
		}
	}
	return 7
}

// uvarintLen is the length of v as binary.AppendUvarint writes it.
func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// lenPrefixed is the length of n bytes behind their uvarint length.
func lenPrefixed(n int) int { return uvarintLen(uint64(n)) + n }

// sections returns the record's trailing sections in increasing tag order:
// the optional fields, the metadata and those kept unread (r.extra).
func (r *Record) sections() [][]byte {
	var out [][]byte
	section := func(tag byte, v []byte) {
		out = append(out, appendLen([]byte{tag}, v))
	}
	if r.Periodic != "" {
		section(sectionPeriodic, []byte(r.Periodic))
	}
	if r.SkipIfRunning || r.HoldsSlot || r.HoldsKeySlot {
		var f byte
		if r.SkipIfRunning {
			f |= flagSkipIfRunning
		}
		if r.HoldsSlot {
			f |= flagHoldsSlot
		}
		if r.HoldsKeySlot {
			f |= flagHoldsKeySlot
		}
		section(sectionFlags, []byte{f})
	}
	if r.Unique != "" {
		section(sectionUnique, []byte(r.Unique))
	}
	if r.UniqueTTL > 0 {
		section(sectionUniqueTTL, binary.AppendUvarint(nil, uint64(r.UniqueTTL)))
	}
	if r.ReplyTo != "" {
		section(sectionReplyTo, []byte(r.ReplyTo))
	}
	if r.Flow != nil {
		section(sectionFlow, r.Flow.encode())
	}
	if r.Snoozes > 0 {
		section(sectionSnoozes, binary.AppendUvarint(nil, uint64(r.Snoozes)))
	}
	if r.Priority > 1 {
		section(sectionPriority, binary.AppendUvarint(nil, uint64(r.Priority)))
	}
	if r.ExpireAt > 0 {
		section(sectionExpireAt, binary.AppendUvarint(nil, uint64(r.ExpireAt)))
	}
	if r.Key != "" {
		section(sectionKey, []byte(r.Key))
	}
	if m := r.encodeMetadata(); len(m) > 0 {
		out = append(out, m)
	}
	out = append(out, r.extra...)
	if len(out) > 1 {
		sort.SliceStable(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	}
	return out
}

// encodeMetadata returns the metadata section, or nothing when there is
// no metadata.
func (r *Record) encodeMetadata() []byte {
	if len(r.Metadata) == 0 {
		return nil
	}
	keys := make([]string, 0, len(r.Metadata))
	for k := range r.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var body []byte
	body = binary.AppendUvarint(body, uint64(len(keys)))
	for _, k := range keys {
		body = appendLen(body, k)
		body = appendLen(body, r.Metadata[k])
	}
	return appendLen([]byte{sectionMetadata}, body)
}

// DecodeRecord parses a stored record (see Encode); id is taken from the
// key. Any input that is not a record Encode made yields an error
// wrapping ErrMalformed, never a panic; a record of another version is
// refused with an error naming its version.
func DecodeRecord(id string, b []byte) (*Record, error) {
	if len(b) < 3 || b[0] != recordMagic {
		return nil, fmt.Errorf("buckets: task %s: not a task record: %w", id, ErrMalformed)
	}
	if b[1] != recordVersion {
		return nil, fmt.Errorf("buckets: task %s: record version %d unknown (this release reads version %d): %w", id, b[1], recordVersion, ErrMalformed)
	}
	r := &Record{ID: id, Queue: defaultQueue, MaxAttempts: defaultMaxAttempts, TimeoutMs: defaultTimeoutMs}
	d := decoder{b: b[2:]}
	h := d.uvarint()
	if d.err {
		return nil, fmt.Errorf("buckets: task %s: truncated record: %w", id, ErrMalformed)
	}
	if code := h & 7; code >= uint64(len(recordStates)) {
		return nil, fmt.Errorf("buckets: task %s: state code %d unknown: %w", id, h&7, ErrMalformed)
	} else {
		r.State = recordStates[code]
	}
	// A field the mask names must differ from what its absence means, so
	// that a record has one encoding; a mask bit this release does not
	// know is refused.
	mask := h >> 3
	if mask&^fKnown != 0 {
		return nil, fmt.Errorf("buckets: task %s: record fields %#x unknown (upgrade this worker): %w", id, mask&^fKnown, ErrMalformed)
	}
	num := func(least uint64) uint64 {
		v := d.uvarint()
		if v < least || v > 1<<53 {
			d.err = true
		}
		return v
	}
	idTime, idOK := IDTime(id)
	switch {
	case mask&fCreatedID != 0:
		if mask&fCreated != 0 || !idOK {
			d.err = true
		}
		r.Created = idTime
	case mask&fCreated != 0:
		if r.Created = int64(num(1)); idOK && r.Created == idTime {
			d.err = true
		}
	}
	r.Due = r.Created
	if mask&fDue != 0 {
		delta, n := binary.Varint(d.b)
		if n <= 0 || delta == 0 {
			d.err = true
		} else {
			d.b = d.b[n:]
			if r.Due = r.Created + delta; r.Due < 0 || r.Due > 1<<53 {
				d.err = true
			}
		}
	}
	if mask&fQueue != 0 {
		if r.Queue = d.name(); r.Queue == defaultQueue {
			d.err = true
		}
	}
	if mask&fMaxAttempts != 0 {
		if v := num(0); v == defaultMaxAttempts || v >= 1<<31 {
			d.err = true
		} else {
			r.MaxAttempts = int(v)
		}
	}
	if mask&fTimeout != 0 {
		if r.TimeoutMs = int64(num(0)); r.TimeoutMs == defaultTimeoutMs {
			d.err = true
		}
	}
	for i, p := range []*int{&r.Attempts, &r.Recoveries, &r.Runs} {
		if mask&(fAttempts<<i) != 0 {
			if v := num(1); v < 1<<31 {
				*p = int(v)
			} else {
				d.err = true
			}
		}
	}
	for i, p := range []*int64{&r.Started, &r.Finished, &r.Deadline} {
		if mask&(fStarted<<i) != 0 {
			*p = int64(num(1))
		}
	}
	if mask&fWorker != 0 {
		if r.Worker = d.name(); r.Worker == "" {
			d.err = true
		}
	}
	if mask&fLastError != 0 {
		if r.LastError = d.str(); r.LastError == "" {
			d.err = true
		}
	}
	r.Type = d.name()
	if mask&fSections != 0 {
		block, ok := d.next()
		if !ok || len(block) == 0 {
			d.err = true
		} else {
			sd := decoder{b: block}
			if err := sd.sections(r); err != nil {
				return nil, err
			}
			d.err = d.err || sd.err
		}
	}
	if d.err {
		return nil, fmt.Errorf("buckets: task %s: truncated or overlong record: %w", id, ErrMalformed)
	}
	r.Payload = append([]byte{}, d.b...)
	return r, nil
}

type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) uvarint() uint64 {
	if d.err {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

// sections reads the trailing sections into r: metadata once at most,
// unknown tags kept as they are in r.extra.
func (d *decoder) sections(r *Record) error {
	// Sections come in increasing tag order, each at most once, so that a
	// record has one encoding.
	prev := -1
	for !d.err && len(d.b) > 0 {
		start := d.b
		tag := d.b[0]
		d.b = d.b[1:]
		body := d.bytes()
		if d.err || int(tag) <= prev {
			d.err = true
			return nil
		}
		prev = int(tag)
		switch tag {
		case sectionPeriodic:
			if len(body) == 0 {
				d.err = true
			}
			r.Periodic = string(body)
		case sectionFlags:
			if len(body) != 1 || body[0] == 0 || body[0]&^(flagSkipIfRunning|flagHoldsSlot|flagHoldsKeySlot) != 0 {
				d.err = true
				break
			}
			r.SkipIfRunning = body[0]&flagSkipIfRunning != 0
			r.HoldsSlot = body[0]&flagHoldsSlot != 0
			r.HoldsKeySlot = body[0]&flagHoldsKeySlot != 0
		case sectionUnique:
			if len(body) == 0 {
				d.err = true
			}
			r.Unique = string(body)
		case sectionUniqueTTL:
			n, k := binary.Uvarint(body)
			if k <= 0 || k != len(body) || n == 0 || n > 1<<53 {
				d.err = true
			}
			r.UniqueTTL = int64(n)
		case sectionReplyTo:
			if len(body) == 0 {
				d.err = true
			}
			r.ReplyTo = string(body)
		case sectionFlow:
			if r.Flow = decodeFlow(body); r.Flow == nil {
				d.err = true
			}
		case sectionSnoozes:
			n, k := binary.Uvarint(body)
			if k <= 0 || k != len(body) || n == 0 || n > 1<<31 {
				d.err = true
			}
			r.Snoozes = int(n)
		case sectionPriority:
			n, k := binary.Uvarint(body)
			if k <= 0 || k != len(body) || n < 2 || n > MaxLevel {
				d.err = true
			}
			r.Priority = int(n)
		case sectionExpireAt:
			n, k := binary.Uvarint(body)
			if k <= 0 || k != len(body) || n == 0 || n > 1<<53 {
				d.err = true
			}
			r.ExpireAt = int64(n)
		case sectionKey:
			if !ValidName(string(body)) {
				d.err = true
			}
			r.Key = string(body)
		case sectionMetadata:
			r.Metadata = decodeMetadata(body)
			if r.Metadata == nil {
				d.err = true
			}
		default:
			if tag < 'a' {
				return fmt.Errorf("buckets: task %s: record field %d unknown (upgrade this worker): %w", r.ID, tag, ErrMalformed)
			}
			r.extra = append(r.extra, append([]byte(nil), start[:len(start)-len(d.b)]...))
		}
	}
	return nil
}

// decodeMetadata parses a metadata section's body; nil when it is
// malformed or holds no pair (an empty section is never written).
func decodeMetadata(body []byte) map[string]string {
	d := decoder{b: body}
	n := d.uvarint()
	if d.err || n == 0 || n > uint64(len(body)) {
		return nil
	}
	m := make(map[string]string, n)
	for range n {
		k := d.str()
		v := d.str()
		if _, dup := m[k]; dup || d.err {
			return nil
		}
		m[k] = v
	}
	if len(d.b) != 0 {
		return nil
	}
	return m
}

func (d *decoder) bytes() []byte {
	b, ok := d.next()
	if !ok {
		return nil
	}
	out := make([]byte, len(b))
	copy(out, b)
	return out
}

// next reads a length-prefixed field without copying it: the bytes stay
// the input's.
func (d *decoder) next() ([]byte, bool) {
	n := d.uvarint()
	if d.err || n > uint64(len(d.b)) {
		d.err = true
		return nil, false
	}
	out := d.b[:n:n]
	d.b = d.b[n:]
	return out, true
}

// str reads a length-prefixed string (one allocation, none when empty).
func (d *decoder) str() string {
	b, _ := d.next()
	return string(b)
}

// name reads a length-prefixed name that records repeat (a queue, a
// type, a worker id), interned: see intern.
func (d *decoder) name() string {
	b, _ := d.next()
	return intern(b)
}

// internTable holds recently decoded names, one per slot picked by a hash
// of the bytes, so that decoding the same queue, type or worker id again
// allocates nothing. A slot holds the last name that hashed to it; a miss
// costs the allocation it would have cost anyway, and one more.
var internTable [256]atomic.Pointer[string]

// intern returns string(b), the table's copy when it holds one.
func intern(b []byte) string {
	if len(b) == 0 || len(b) > 64 {
		return string(b)
	}
	h := uint32(2166136261) // FNV-1a
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	slot := &internTable[h%uint32(len(internTable))]
	if p := slot.Load(); p != nil && *p == string(b) {
		return *p
	}
	s := string(b)
	slot.Store(&s)
	return s
}

// Validate checks what a producer gives before anything is written: names,
// sizes and numbers. maxPayload bounds the payload in bytes.
func (r *Record) Validate(maxPayload int) error {
	if !ValidName(r.Queue) {
		return fmt.Errorf("queue name %s: want 1-64 of A-Z a-z 0-9 _ . -: %w", safetext.Quote(r.Queue), ErrInvalid)
	}
	if r.Type == "" || len(r.Type) > MaxTypeLen || !utf8.ValidString(r.Type) {
		return fmt.Errorf("task type %s: want 1-%d bytes of UTF-8, not %d: %w", safetext.Quote(r.Type), MaxTypeLen, len(r.Type), ErrInvalid)
	}
	for _, c := range r.Type {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("task type %s: control characters are not allowed: %w", safetext.Quote(r.Type), ErrInvalid)
		}
	}
	if len(r.Payload) > maxPayload {
		return fmt.Errorf("payload of %d bytes, limit %d: %w", len(r.Payload), maxPayload, ErrTooLarge)
	}
	if r.MaxAttempts < 1 {
		return fmt.Errorf("max attempts %d: want at least 1", r.MaxAttempts)
	}
	if r.TimeoutMs < 1 {
		return fmt.Errorf("timeout %d ms: want at least 1 ms", r.TimeoutMs)
	}
	if r.Priority < 0 || r.Priority > MaxLevel {
		return fmt.Errorf("priority %d: want 1 to %d: %w", r.Priority, MaxLevel, ErrInvalid)
	}
	if r.ExpireAt != 0 && r.ExpireAt < r.Due {
		return fmt.Errorf("expiry %d ms before the due time: the task could never start: %w", r.Due-r.ExpireAt, ErrInvalid)
	}
	return ValidateMetadata(r.Metadata)
}

// ValidateMetadata checks metadata pairs: at most MaxMetadata, keys of 1
// to MaxMetadataKeyLen bytes of UTF-8, values of UTF-8, MaxMetadataBytes
// in all.
func ValidateMetadata(m map[string]string) error {
	if len(m) > MaxMetadata {
		return fmt.Errorf("metadata of %d pairs, limit %d: %w", len(m), MaxMetadata, ErrTooLarge)
	}
	total := 0
	for k, v := range m {
		if k == "" || len(k) > MaxMetadataKeyLen || !utf8.ValidString(k) {
			return fmt.Errorf("metadata key %s: want 1-%d bytes of UTF-8: %w", safetext.Quote(k), MaxMetadataKeyLen, ErrInvalid)
		}
		if !utf8.ValidString(v) {
			return fmt.Errorf("metadata value of %q: want UTF-8: %w", k, ErrInvalid)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return fmt.Errorf("metadata of %d bytes, limit %d: %w", total, MaxMetadataBytes, ErrTooLarge)
	}
	return nil
}
