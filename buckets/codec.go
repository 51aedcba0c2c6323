package buckets

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
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
}

// Limits on record fields, checked by Validate.
const (
	MaxTypeLen  = 256
	MaxErrorLen = 4096
)

const (
	recordMagic   = 'B'
	recordVersion = 1
	// recordVersion2 is version 1 followed by a trailing section of
	// optional fields: each a tag byte and a length-prefixed value, tags
	// strictly increasing. A decoder refuses a tag it does not know, so
	// that an older worker buries such a record saying why rather than
	// running it without the field.
	recordVersion2 = 2
)

// Tags of the trailing section. Each feature owns its tags; a field
// added later takes a tag not used here.
const (
	tagUnique    = 'u' // Record.Unique: the bytes
	tagUniqueTTL = 'v' // Record.UniqueTTL: an unsigned varint
	tagReplyTo   = 'y' // Record.ReplyTo: the bytes
)

// Encode returns the stored form of r: a magic byte and version, the state,
// unsigned varints for the numbers, and length-prefixed strings, payload
// last. It is compact because a record is most of a task's memory.
func (r *Record) Encode() []byte {
	n := 2 + 1 + 9*binary.MaxVarintLen64 + 5*binary.MaxVarintLen32 +
		len(r.Queue) + len(r.Type) + len(r.Worker) + len(r.LastError) + len(r.Payload)
	b := make([]byte, 0, n)
	b = append(b, recordMagic, recordVersion, byte(r.State))
	for _, v := range []int64{int64(r.Attempts), int64(r.Recoveries), int64(r.Runs), int64(r.MaxAttempts),
		r.TimeoutMs, r.Created, r.Due, r.Started, r.Finished, r.Deadline} {
		b = binary.AppendUvarint(b, uint64(max(v, 0)))
	}
	for _, s := range []string{r.Queue, r.Type, r.Worker, r.LastError} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Payload)))
	b = append(b, r.Payload...)
	if r.Unique == "" && r.UniqueTTL <= 0 && r.ReplyTo == "" {
		return b
	}
	b[1] = recordVersion2
	field := func(tag byte, v []byte) {
		b = append(b, tag)
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	if r.Unique != "" {
		field(tagUnique, []byte(r.Unique))
	}
	if r.UniqueTTL > 0 {
		field(tagUniqueTTL, binary.AppendUvarint(nil, uint64(r.UniqueTTL)))
	}
	if r.ReplyTo != "" {
		field(tagReplyTo, []byte(r.ReplyTo))
	}
	return b
}

// DecodeRecord parses a stored record; id is taken from the key. Any
// input that is not a record Encode made yields an error wrapping
// ErrMalformed, never a panic.
func DecodeRecord(id string, b []byte) (*Record, error) {
	d := decoder{b: b}
	if len(b) < 3 || b[0] != recordMagic {
		return nil, fmt.Errorf("buckets: task %s: not a task record: %w", id, ErrMalformed)
	}
	if b[1] != recordVersion && b[1] != recordVersion2 {
		return nil, fmt.Errorf("buckets: task %s: record version %d unknown (upgrade this worker): %w", id, b[1], ErrMalformed)
	}
	r := &Record{ID: id, State: State(b[2])}
	if !r.State.valid() {
		return nil, fmt.Errorf("buckets: task %s: state %q unknown: %w", id, b[2], ErrMalformed)
	}
	d.b = b[3:]
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
	r.Queue = string(d.bytes())
	r.Type = string(d.bytes())
	r.Worker = string(d.bytes())
	r.LastError = string(d.bytes())
	r.Payload = d.bytes()
	if b[1] == recordVersion2 && !d.err {
		if err := r.decodeOptional(&d); err != nil {
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

// decodeOptional reads the trailing section of a version 2 record.
func (r *Record) decodeOptional(d *decoder) error {
	last := -1
	for len(d.b) > 0 && !d.err {
		tag := d.b[0]
		d.b = d.b[1:]
		if int(tag) <= last {
			return fmt.Errorf("buckets: task %s: record field %q out of order: %w", r.ID, tag, ErrMalformed)
		}
		last = int(tag)
		v := d.bytes()
		if d.err {
			break
		}
		switch tag {
		case tagUnique:
			r.Unique = string(v)
		case tagUniqueTTL:
			n, k := binary.Uvarint(v)
			if k <= 0 || k != len(v) || n > 1<<53 {
				return fmt.Errorf("buckets: task %s: unique ttl field: %w", r.ID, ErrMalformed)
			}
			r.UniqueTTL = int64(n)
		case tagReplyTo:
			r.ReplyTo = string(v)
		default:
			return fmt.Errorf("buckets: task %s: record field %q unknown (upgrade this worker): %w", r.ID, tag, ErrMalformed)
		}
	}
	return nil
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

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err || n > uint64(len(d.b)) {
		d.err = true
		return nil
	}
	out := make([]byte, n)
	copy(out, d.b[:n])
	d.b = d.b[n:]
	return out
}

// Validate checks what a producer gives before anything is written: names,
// sizes and numbers. maxPayload bounds the payload in bytes.
func (r *Record) Validate(maxPayload int) error {
	if !ValidName(r.Queue) {
		return fmt.Errorf("queue name %q: want 1-64 of A-Z a-z 0-9 _ . -: %w", r.Queue, ErrInvalidName)
	}
	if r.Type == "" || len(r.Type) > MaxTypeLen || !utf8.ValidString(r.Type) {
		return fmt.Errorf("task type %q: want 1-%d bytes of UTF-8: %w", r.Type, MaxTypeLen, ErrInvalidName)
	}
	for _, c := range r.Type {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("task type %q: control characters are not allowed: %w", r.Type, ErrInvalidName)
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
	return nil
}
