package schedule

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// ErrInvalid is wrapped by the errors of [ValidateName].
var ErrInvalid = errors.New("invalid entry name")

// MaxNameLen is the longest entry name, in bytes.
const MaxNameLen = 256

// ValidateName checks a periodic entry's name: 1 to MaxNameLen bytes of
// printable UTF-8 (spaces allowed inside, not at either end). Names are
// what processes match entries by, so look-alikes made of control or
// invisible characters are refused.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: the name is empty", ErrInvalid)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %q… is %d bytes long; at most %d", ErrInvalid, name[:32], len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalid, name)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%w: %q starts or ends with white space", ErrInvalid, name)
	}
	for i, r := range name {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %q: character %U at byte %d is not printable", ErrInvalid, name, r, i)
		}
	}
	return nil
}

// MaxIDLen is the longest task id the engine accepts, in bytes.
const MaxIDLen = 128

// idPrefix marks the task ids of periodic firings.
const idPrefix = "p:"

// FiringID is the task id of entry's firing at firing: a valid
// caller-chosen task id (1 to MaxIDLen printable ASCII bytes, no white
// space) that depends only on the name and the instant, so every process
// enqueueing the same firing uses the same id and the engine keeps one.
//
// The form is "p:<name>@<UTC time>", such as
// "p:nightly-report@20260329T010000Z" (fractions of a second follow the
// seconds when there are any). A name of other characters than A-Z a-z
// 0-9 - _ . : / + = , or too long to fit is written as a readable prefix
// (other characters replaced by '_') followed by '~' and 16 hex digits of
// its SHA-256. The time part never contains '@' and a name written as is
// never contains '~', so distinct (name, firing) pairs give distinct ids.
func FiringID(name string, firing time.Time) string {
	stamp := formatStamp(firing)
	if len(idPrefix)+len(name)+1+len(stamp) <= MaxIDLen && plain(name) {
		return idPrefix + name + "@" + stamp
	}
	sum := sha256.Sum256([]byte(name))
	digest := hex.EncodeToString(sum[:8])
	room := MaxIDLen - len(idPrefix) - 1 - len(digest) - 1 - len(stamp)
	var b strings.Builder
	b.WriteString(idPrefix)
	for _, r := range name {
		if b.Len()-len(idPrefix) >= room {
			break
		}
		if r < utf8.RuneSelf && plainByte(byte(r)) {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	b.WriteByte('~')
	b.WriteString(digest)
	b.WriteByte('@')
	b.WriteString(stamp)
	return b.String()
}

// formatStamp writes an instant in UTC, to the nanosecond when needed:
// "20260329T010000Z", "20260329T010000.25Z". Years outside 0-9999 (no
// schedule fires there) are written as Unix seconds, "u<sec>[.<frac>]Z".
func formatStamp(t time.Time) string {
	t = t.UTC()
	var s string
	if y := t.Year(); y >= 0 && y <= 9999 {
		s = t.Format("20060102T150405")
	} else {
		s = "u" + strconv.FormatInt(t.Unix(), 10)
	}
	if ns := t.Nanosecond(); ns != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%09d", ns), "0")
	}
	return s + "Z"
}

func plain(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !plainByte(name[i]) {
			return false
		}
	}
	return true
}

func plainByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-_.:/+=,", c) >= 0
}
