package buckets

import "encoding/binary"

// Version 3 is what the release before version 4 wrote with compact
// records on. Nothing writes it now; every release reads it, so the tests
// keep its encoder to make such records.

// encode3 returns version 3: the magic byte 'B', the version, the state,
// a uvarint mask of the numeric and text fields that are not zero (field*
// bits), those fields in bit order (unsigned varints, Due as the zigzag
// varint of Due − Created, Worker and LastError length-prefixed), then the
// length-prefixed queue, type and payload, then the trailing sections
// (see sections). A field at zero takes no byte: a waiting task's header
// is about 30 bytes where version 1's is 40.
func (r *Record) encode3() []byte {
	n := 3 + 12*binary.MaxVarintLen64 +
		len(r.Queue) + len(r.Type) + len(r.Worker) + len(r.LastError) + len(r.Payload)
	sections := r.sections()
	for _, sec := range sections {
		n += len(sec)
	}
	nums := r.numbers()
	var mask uint64
	for i, v := range nums {
		if v > 0 {
			mask |= 1 << i
		}
	}
	if r.Worker != "" {
		mask |= fieldWorker
	}
	if r.LastError != "" {
		mask |= fieldLastError
	}
	b := make([]byte, 0, n)
	b = append(b, recordMagic, recordVersion3, byte(r.State))
	b = binary.AppendUvarint(b, mask)
	for i, v := range nums {
		switch {
		case mask&(1<<i) == 0:
		case 1<<i == fieldDue:
			b = binary.AppendVarint(b, v-max(r.Created, 0))
		default:
			b = binary.AppendUvarint(b, uint64(v))
		}
	}
	for _, s := range []string{r.Worker, r.LastError} {
		if s != "" {
			b = appendLen(b, s)
		}
	}
	b = appendLen(b, r.Queue)
	b = appendLen(b, r.Type)
	b = appendLen(b, r.Payload)
	for _, sec := range sections {
		b = append(b, sec...)
	}
	return b
}
