package buckets

import (
	"crypto/rand"
	"encoding/binary"
	"math/bits"
)

// IDLen is the length of a generated task id: 128 bits in base 62
// (62^22 > 2^128), which is what a task costs in every key and list that
// names it; a canonical UUID spells the same bits in 36 characters.
const IDLen = 22

// Base62 is the alphabet of generated ids, most significant digit first.
const Base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// idTimeBits is how many of an id's top bits hold the Unix millisecond it
// was made in; the rest are random.
const idTimeBits = 48

// NewID returns a new task id made at Unix millisecond nowMs: 128 bits,
// nowMs in the top 48 (a ULID's layout) and 80 bits of crypto/rand below,
// as IDLen base62 digits, zero-padded. Ids made in one millisecond share
// their first digits and differ in the random bits. IDTime reads the
// time back, which is why a task record need not store when its
// task was created. A nowMs outside 1 to 2^48−1 is stored as 0 (IDTime
// then reports none).
func NewID(nowMs int64) string {
	var b [16]byte
	_, _ = rand.Read(b[6:]) // crypto/rand.Read never fails (it crashes the program instead)
	if nowMs > 0 && nowMs < 1<<idTimeBits {
		binary.BigEndian.PutUint16(b[0:2], uint16(nowMs>>32))
		binary.BigEndian.PutUint32(b[2:6], uint32(nowMs))
	}
	return EncodeID(b)
}

// EncodeID spells 128 bits (big-endian) as IDLen base62 digits.
func EncodeID(b [16]byte) string {
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	var out [IDLen]byte
	for i := IDLen - 1; i >= 0; i-- {
		var r uint64
		hi, r = hi/62, hi%62
		lo, r = bits.Div64(r, lo, 62)
		out[i] = Base62[r]
	}
	return string(out[:])
}

// IDTime returns the Unix millisecond in the top 48 bits of id's 128, when
// id starts with IDLen base62 digits spelling at most 128 bits and the
// rest, if any, starts with '~' (a lane suffix "~k", see the engine's
// LaneOf, or a reply task's "~r<run>.<finished>"). Any id of that shape
// has such a time, generated or chosen: a task record uses it only
// when it equals the record's Created (fCreatedID), so an id can never
// make a record decode to another time.
func IDTime(id string) (int64, bool) {
	if len(id) < IDLen || len(id) > IDLen && id[IDLen] != '~' {
		return 0, false
	}
	var hi, lo uint64
	for i := 0; i < IDLen; i++ {
		d := digit62(id[i])
		if d < 0 {
			return 0, false
		}
		// (hi, lo) = (hi, lo) * 62 + d, refusing what passes 128 bits.
		h1, h0 := bits.Mul64(hi, 62)
		l1, l0 := bits.Mul64(lo, 62)
		var c uint64
		lo, c = bits.Add64(l0, uint64(d), 0)
		var c2 uint64
		hi, c2 = bits.Add64(h0, l1, c)
		if h1 != 0 || c2 != 0 {
			return 0, false
		}
	}
	ms := int64(hi >> (64 - idTimeBits))
	if ms == 0 {
		return 0, false
	}
	return ms, true
}

func digit62(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'Z':
		return int(c-'A') + 10
	case c >= 'a' && c <= 'z':
		return int(c-'a') + 36
	}
	return -1
}
