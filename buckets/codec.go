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

// Task states as stored in the record.
const (
	StateWaiting   State = 'w' // in a bucket or a ready list, not yet run
	StateRetry     State = 'r' // failed, waiting in a bucket or ready list to run again
	StateRunning   State = 'a' // claimed by a worker, in its pending set
	StateDone      State = 'd' // succeeded; kept for the done retention
	StateDead      State = 'x' // in the dead letters
	StateCancelled State = 'c' // cancelled before it ran; kept for the done retention
)

func (s State) valid() bool {
	switch s {
	case StateWaiting, StateRetry, StateRunning, StateDone, StateDead, StateCancelled:
		return true
	}
	return false
}

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
	ID          string // not encoded: it is in the key
	Queue       string
	Type        string
	Payload     []byte
	State       State
	Attempts    int   // handler runs that failed
	Recoveries  int   // times its worker died or lost the lease while running it
	Runs        int   // times it was claimed; names the current run for ack
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
	// the record's trailing sections (version 2), see Encode.
	Metadata map[string]string

	// extra holds the trailing sections this version does not know, as
	// read, so that rewriting a record written by a newer version keeps
	// them.
	extra [][]byte // whole sections, tag byte first

	// Optional fields, encoded in the trailing section of a version 2
	// record (see Encode); a record without any is written as version 1.

	// Periodic is the name of the periodic entry whose firing this task
	// is ("" for other tasks).
	Periodic string
	// SkipIfRunning: the claim skips (cancels) this firing while the
	// previous run of its entry is still running.
	SkipIfRunning bool

	// Optional fields, stored in the record's trailing section (version
	// 2); a record that sets none of them is stored as version 1.

	// Unique is the unique key the task holds (the name after "u:", see
	// [Keys.Unique]); "" for none. The key is held while this record is
	// waiting, retrying or running and names it.
	Unique string
	// UniqueTTL is the unique key's lifetime in seconds; 0 holds it until
	// the task ends, and then the final transition deletes it.
	UniqueTTL int64
	// ReplyTo names a reply list ([Keys.Reply]) onto which every final
	// transition pushes a reply; "" for none.
	ReplyTo string

	// Result is not stored in the record: Finish's decide sets it on a
	// Done outcome, and it is stored under [Keys.Result].
	Result []byte

	// Spawned is not stored: a final transition's writes set it to the
	// tasks they enqueue besides the record (a chain's next step, a
	// group's callback, a reply task), for the caller to report once the
	// transaction committed.
	Spawned []*Record

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

const (
	recordMagic = 'B'
	// recordVersion 1 ends with the payload. Version 2 has trailing
	// sections after it, each a tag byte, a uvarint length and that many
	// bytes. Version 3 was written by the release before version 4 when
	// compact records were on; version 4 (encode4) is written when they
	// are on now. Every version is read.
	recordVersion  = 1
	recordVersion2 = 2
	recordVersion3 = 3
	recordVersion4 = 4
)

// Version 4 fields, by their bit in the record's presence mask (see
// encode4). Each is stored only when it differs from what its absence
// means, in this order.
const (
	f4CreatedID   = 1 << iota // Created is the time in the id (IDTime): no bytes
	f4Due                     // Due ≠ Created: the zigzag varint of Due − Created
	f4Created                 // Created otherwise, when not 0: a uvarint
	f4Queue                   // Queue ≠ v4Queue: length-prefixed
	f4MaxAttempts             // MaxAttempts ≠ v4MaxAttempts: a uvarint
	f4Timeout                 // TimeoutMs ≠ v4TimeoutMs: a uvarint
	f4Attempts                // then, when not 0: uvarints
	f4Recoveries
	f4Runs
	f4Started
	f4Finished
	f4Deadline
	f4Worker    // length-prefixed, when not ""
	f4LastError // length-prefixed, when not ""
	f4Sections  // the trailing sections, after the type: their length, then them
	f4Known     = f4Sections<<1 - 1
)

// What a version 4 record means when it leaves a field out: the defaults
// of the engine that introduced it. They are part of the format, so they
// stay these values whatever a later release's defaults become.
const (
	v4Queue       = "default"
	v4MaxAttempts = 25
	v4TimeoutMs   = 30 * 60 * 1000
)

// v4States are the states by their code in a version 4 record's first
// uvarint (its low 3 bits).
var v4States = [...]State{StateWaiting, StateRetry, StateRunning, StateDone, StateDead, StateCancelled}

// Version 3 numeric fields, by their bit in the record's presence mask: a
// field is stored only when it is not zero, in this order.
const (
	fieldAttempts = 1 << iota
	fieldRecoveries
	fieldRuns
	fieldMaxAttempts
	fieldTimeout
	fieldCreated
	fieldDue // zigzag of Due − Created
	fieldStarted
	fieldFinished
	fieldDeadline
	fieldWorker
	fieldLastError
	fieldsKnown = fieldLastError<<1 - 1
)

// Trailing section tags (version 2).
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
	sectionPeriodic  = 1 // the periodic entry's name
	sectionFlags     = 2 // one byte of flags: flagSkipIfRunning
	sectionUnique    = 3 // Record.Unique
	sectionUniqueTTL = 4 // Record.UniqueTTL, an unsigned varint
	sectionReplyTo   = 5 // Record.ReplyTo
	sectionFlow      = 6 // Record.Flow (workflow.go)
)

const flagSkipIfRunning = 1

// Encode returns the stored form of r. Version 4 (see encode4) when
// WriteCompactRecords is on; otherwise version 1, or version 2 when the
// record has trailing sections, which every earlier release reads. A
// record is most of a task's memory, so every form is compact: varints,
// length-prefixed strings. A Store encodes with EncodeRecord, which also
// honours Store.Compact.
func (r *Record) Encode() []byte {
	return r.encode(compactRecords.Load())
}

func (r *Record) encode(compact bool) []byte {
	if compact {
		return r.encode4()
	}
	return r.encodeLegacy()
}

// EncodeRecord returns the stored form of r as this store writes it:
// version 4 when s.Compact (or WriteCompactRecords) is on, or s.Auto and
// the namespace's format mark allows it (ResolveFormat), else what Encode
// writes.
func (s *Store) EncodeRecord(r *Record) []byte {
	return r.encode(s.compact())
}

// compactRecords: Encode writes version 4 (WriteCompactRecords).
var compactRecords atomic.Bool

// WriteCompactRecords makes Encode, in this whole process, write version
// 4 records (on), whose header is 20 to 30 bytes shorter, or the version 1
// and 2 records that earlier releases read (off, the default). Store.Compact
// sets the same for one store. This release reads versions 1 to 4. Turn
// it on only once no process of an earlier release runs against the
// namespace: such a process cannot read version 4 and buries a record it
// meets as a dead letter holding the raw bytes.
func WriteCompactRecords(on bool) { compactRecords.Store(on) }

// encodeLegacy returns version 1: the magic byte, the version, the state,
// ten unsigned varints (attempts, recoveries, runs, max attempts, timeout,
// created, due, started, finished, deadline), the length-prefixed queue,
// type, worker and last error, and the payload; version 2 when the record
// has trailing sections, which follow.
func (r *Record) encodeLegacy() []byte {
	sections := r.sections()
	nums := r.numbers()
	strs := [...]string{r.Queue, r.Type, r.Worker, r.LastError}
	// The exact length: a record is written for every task, and room to
	// spare would put many in a larger allocator class.
	n := 3 + lenPrefixed(len(r.Payload))
	for _, v := range nums {
		n += uvarintLen(uint64(max(v, 0)))
	}
	for _, s := range strs {
		n += lenPrefixed(len(s))
	}
	for _, sec := range sections {
		n += len(sec)
	}
	version := byte(recordVersion)
	if len(sections) > 0 {
		version = recordVersion2
	}
	b := make([]byte, 0, n)
	b = append(b, recordMagic, version, byte(r.State))
	for _, v := range nums {
		b = binary.AppendUvarint(b, uint64(max(v, 0)))
	}
	for _, s := range strs {
		b = appendLen(b, s)
	}
	b = appendLen(b, r.Payload)
	for _, sec := range sections {
		b = append(b, sec...)
	}
	return b
}

// encode4 returns version 4: the magic byte 'B', the version, a uvarint
// of the mask of the fields stored (f4* bits) shifted left by 3 and the
// state's code (v4States) in the low 3 bits, those fields in bit order,
// the length-prefixed type, the trailing sections when there are any
// (their total length, then each as in version 2; see sections), and the
// payload: the rest of the record, with no length. A field at what its
// absence means takes no byte: a task created with a generated id
// (IDTime), on the default queue with the default attempts and timeout,
// stores its state, its due time relative to its creation, its type and
// its payload, a header of 4 bytes plus the type and the due delta.
func (r *Record) encode4() []byte {
	created, due := max(r.Created, 0), max(r.Due, 0)
	var mask uint64
	if t, ok := IDTime(r.ID); ok && created == t {
		mask |= f4CreatedID
	} else if created > 0 {
		mask |= f4Created
	}
	if due != created {
		mask |= f4Due
	}
	if r.Queue != v4Queue {
		mask |= f4Queue
	}
	maxAttempts, timeout := int64(max(r.MaxAttempts, 0)), max(r.TimeoutMs, 0)
	if maxAttempts != v4MaxAttempts {
		mask |= f4MaxAttempts
	}
	if timeout != v4TimeoutMs {
		mask |= f4Timeout
	}
	counts := [...]int64{int64(r.Attempts), int64(r.Recoveries), int64(r.Runs), r.Started, r.Finished, r.Deadline}
	for i, v := range counts {
		if v > 0 {
			mask |= f4Attempts << i
		}
	}
	if r.Worker != "" {
		mask |= f4Worker
	}
	if r.LastError != "" {
		mask |= f4LastError
	}
	sections := r.sections()
	size := 0
	for _, sec := range sections {
		size += len(sec)
	}
	if size > 0 {
		mask |= f4Sections
	}
	b := make([]byte, 0, 2+12*binary.MaxVarintLen64+
		len(r.Queue)+len(r.Type)+len(r.Worker)+len(r.LastError)+size+len(r.Payload))
	b = append(b, recordMagic, recordVersion4)
	b = binary.AppendUvarint(b, mask<<3|uint64(stateCode(r.State)))
	if mask&f4Created != 0 {
		b = binary.AppendUvarint(b, uint64(created))
	}
	if mask&f4Due != 0 {
		b = binary.AppendVarint(b, due-created)
	}
	if mask&f4Queue != 0 {
		b = appendLen(b, r.Queue)
	}
	if mask&f4MaxAttempts != 0 {
		b = binary.AppendUvarint(b, uint64(maxAttempts))
	}
	if mask&f4Timeout != 0 {
		b = binary.AppendUvarint(b, uint64(timeout))
	}
	for i, v := range counts {
		if mask&(f4Attempts<<i) != 0 {
			b = binary.AppendUvarint(b, uint64(v))
		}
	}
	for _, s := range []string{r.Worker, r.LastError} {
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

// stateCode is st's code in a version 4 record; 7, which no decoder
// takes, for a state that is not one (as versions 1 to 3 write the byte
// as it is, for the decoder to refuse).
func stateCode(st State) int {
	for i, v := range v4States {
		if v == st {
			return i
		}
	}
	return 7
}

// numbers returns the record's numeric fields in the order both encodings
// write them (version 3's mask bits follow it: fieldAttempts ...
// fieldDeadline).
func (r *Record) numbers() [10]int64 {
	return [10]int64{int64(r.Attempts), int64(r.Recoveries), int64(r.Runs), int64(r.MaxAttempts),
		r.TimeoutMs, r.Created, r.Due, r.Started, r.Finished, r.Deadline}
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
	if r.SkipIfRunning {
		section(sectionFlags, []byte{flagSkipIfRunning})
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

// DecodeRecord parses a stored record of any version; id is taken from
// the key. Any input that is not a record Encode made (in this release or
// an earlier one) yields an error wrapping ErrMalformed, never a panic.
func DecodeRecord(id string, b []byte) (*Record, error) {
	if len(b) < 3 || b[0] != recordMagic {
		return nil, fmt.Errorf("buckets: task %s: not a task record: %w", id, ErrMalformed)
	}
	if b[1] == recordVersion4 {
		return decode4(id, b[2:])
	}
	if b[1] != recordVersion && b[1] != recordVersion2 && b[1] != recordVersion3 {
		return nil, fmt.Errorf("buckets: task %s: record version %d unknown (upgrade this worker): %w", id, b[1], ErrMalformed)
	}
	r := &Record{ID: id, State: State(b[2])}
	if !r.State.valid() {
		return nil, fmt.Errorf("buckets: task %s: state %q unknown: %w", id, b[2], ErrMalformed)
	}
	d := decoder{b: b[3:]}
	if b[1] == recordVersion3 {
		if err := d.header3(r); err != nil {
			return nil, err
		}
	} else {
		d.header1(r)
	}
	r.Payload = d.bytes()
	if b[1] != recordVersion && !d.err {
		if err := d.sections(r); err != nil {
			return nil, err
		}
	}
	if d.err || len(d.b) != 0 {
		return nil, fmt.Errorf("buckets: task %s: truncated or overlong record: %w", id, ErrMalformed)
	}
	if r.Payload == nil {
		r.Payload = []byte{}
	}
	return r, nil
}

// header1 reads the fields of a version 1 or 2 record up to the payload:
// the ten numbers, then queue, type, worker and last error.
func (d *decoder) header1(r *Record) {
	ints := []*int64{nil, nil, nil, nil, &r.TimeoutMs, &r.Created, &r.Due, &r.Started, &r.Finished, &r.Deadline}
	small := []*int{&r.Attempts, &r.Recoveries, &r.Runs, &r.MaxAttempts}
	for i := range ints {
		v := d.uvarint()
		if v > 1<<53 {
			d.err = true
		}
		if i < len(small) {
			*small[i] = int(min(v, 1<<31))
			if v >= 1<<31 {
				d.err = true
			}
			continue
		}
		*ints[i] = int64(v)
	}
	r.Queue = d.name()
	r.Type = d.name()
	r.Worker = d.name()
	r.LastError = d.str()
}

// header3 reads the fields of a version 3 record up to the payload (see
// Encode). A field the mask names must not be zero, so that a record has
// one encoding; a mask bit this version does not know is refused.
func (d *decoder) header3(r *Record) error {
	mask := d.uvarint()
	if mask&^fieldsKnown != 0 {
		return fmt.Errorf("buckets: task %s: record fields %#x unknown (upgrade this worker): %w", r.ID, mask&^fieldsKnown, ErrMalformed)
	}
	small := []*int{&r.Attempts, &r.Recoveries, &r.Runs, &r.MaxAttempts}
	ints := []*int64{&r.TimeoutMs, &r.Created, &r.Due, &r.Started, &r.Finished, &r.Deadline}
	for i := range len(small) + len(ints) {
		if mask&(1<<i) == 0 {
			continue
		}
		var v uint64
		if 1<<i == fieldDue {
			delta, n := binary.Varint(d.b)
			if n <= 0 || d.err {
				d.err = true
				return nil
			}
			d.b = d.b[n:]
			due := r.Created + delta
			if due < 1 || due > 1<<53 {
				d.err = true
			}
			v = uint64(max(due, 0))
		} else if v = d.uvarint(); v == 0 || v > 1<<53 {
			d.err = true
		}
		if i < len(small) {
			*small[i] = int(min(v, 1<<31))
			if v >= 1<<31 {
				d.err = true
			}
			continue
		}
		*ints[i-len(small)] = int64(v)
	}
	d.workerAndError(r, mask&fieldWorker != 0, mask&fieldLastError != 0)
	r.Queue = d.name()
	r.Type = d.name()
	return nil
}

// decode4 parses the rest of a version 4 record, after 'B' and the
// version (see encode4). A field the mask names must differ from what
// its absence means, so that a record has one encoding; a mask bit this
// version does not know is refused ("upgrade this worker").
func decode4(id string, b []byte) (*Record, error) {
	r := &Record{ID: id, Queue: v4Queue, MaxAttempts: v4MaxAttempts, TimeoutMs: v4TimeoutMs}
	d := decoder{b: b}
	h := d.uvarint()
	if d.err {
		return nil, fmt.Errorf("buckets: task %s: truncated record: %w", id, ErrMalformed)
	}
	if code := h & 7; code >= uint64(len(v4States)) {
		return nil, fmt.Errorf("buckets: task %s: state code %d unknown: %w", id, h&7, ErrMalformed)
	} else {
		r.State = v4States[code]
	}
	mask := h >> 3
	if mask&^f4Known != 0 {
		return nil, fmt.Errorf("buckets: task %s: record fields %#x unknown (upgrade this worker): %w", id, mask&^f4Known, ErrMalformed)
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
	case mask&f4CreatedID != 0:
		if mask&f4Created != 0 || !idOK {
			d.err = true
		}
		r.Created = idTime
	case mask&f4Created != 0:
		if r.Created = int64(num(1)); idOK && r.Created == idTime {
			d.err = true
		}
	}
	r.Due = r.Created
	if mask&f4Due != 0 {
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
	if mask&f4Queue != 0 {
		if r.Queue = d.name(); r.Queue == v4Queue {
			d.err = true
		}
	}
	if mask&f4MaxAttempts != 0 {
		if v := num(0); v == v4MaxAttempts || v >= 1<<31 {
			d.err = true
		} else {
			r.MaxAttempts = int(v)
		}
	}
	if mask&f4Timeout != 0 {
		if r.TimeoutMs = int64(num(0)); r.TimeoutMs == v4TimeoutMs {
			d.err = true
		}
	}
	for i, p := range []*int{&r.Attempts, &r.Recoveries, &r.Runs} {
		if mask&(f4Attempts<<i) != 0 {
			if v := num(1); v < 1<<31 {
				*p = int(v)
			} else {
				d.err = true
			}
		}
	}
	for i, p := range []*int64{&r.Started, &r.Finished, &r.Deadline} {
		if mask&(f4Started<<i) != 0 {
			*p = int64(num(1))
		}
	}
	d.workerAndError(r, mask&f4Worker != 0, mask&f4LastError != 0)
	r.Type = d.name()
	if mask&f4Sections != 0 {
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

// workerAndError reads the worker and the last error of a version 3 or 4
// record, each when its mask bit says it is stored: then it must not be
// empty.
func (d *decoder) workerAndError(r *Record, worker, lastError bool) {
	if worker {
		if r.Worker = d.name(); r.Worker == "" {
			d.err = true
		}
	}
	if lastError {
		if r.LastError = d.str(); r.LastError == "" {
			d.err = true
		}
	}
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
			if len(body) != 1 || body[0] != flagSkipIfRunning {
				d.err = true
			}
			r.SkipIfRunning = true
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
		return fmt.Errorf("queue name %s: want 1-64 of A-Z a-z 0-9 _ . -: %w", safetext.Quote(r.Queue), ErrInvalidName)
	}
	if r.Type == "" || len(r.Type) > MaxTypeLen || !utf8.ValidString(r.Type) {
		return fmt.Errorf("task type %s: want 1-%d bytes of UTF-8, not %d: %w", safetext.Quote(r.Type), MaxTypeLen, len(r.Type), ErrInvalidName)
	}
	for _, c := range r.Type {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("task type %s: control characters are not allowed: %w", safetext.Quote(r.Type), ErrInvalidName)
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
			return fmt.Errorf("metadata key %s: want 1-%d bytes of UTF-8: %w", safetext.Quote(k), MaxMetadataKeyLen, ErrInvalidName)
		}
		if !utf8.ValidString(v) {
			return fmt.Errorf("metadata value of %q: want UTF-8: %w", k, ErrInvalidName)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return fmt.Errorf("metadata of %d bytes, limit %d: %w", total, MaxMetadataBytes, ErrTooLarge)
	}
	return nil
}
