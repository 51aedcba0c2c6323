package redis24

import (
	"fmt"
	"strings"
)

// Mode is a deployment mode whose own commands a guarded connection may
// send besides the Redis 2.4 table: the commands that find the right
// server in a Redis Cluster or behind Redis Sentinel (package topology).
// The engine's own commands never leave the 2.4 table in any mode.
type Mode string

// Modes known to [ForMode].
const (
	// ModeCluster adds CLUSTER SLOTS, which loads the slot map.
	ModeCluster Mode = "cluster"
	// ModeSentinel adds SENTINEL get-master-addr-by-name (to sentinels),
	// ROLE and INFO replication (to a server, to check that it is a
	// master).
	ModeSentinel Mode = "sentinel"
)

// modeForms are the exact forms each mode may send: the command and its
// first argument, lower case ("" for none).
var modeForms = map[Mode]map[string]string{
	ModeCluster:  {"cluster": "slots"},
	ModeSentinel: {"sentinel": "get-master-addr-by-name", "role": "", "info": "replication"},
}

// ForMode lets through, besides the 2.4 table, the commands of mode in the
// forms package topology sends them, and nothing else; an unknown mode
// adds nothing. Give it only to the connections a topology opens for its
// own use (its DialControl and DialSentinel), never to the engine's.
func ForMode(mode Mode) Option {
	return func(c *conn) { c.mode = mode }
}

// ModeCommands returns, for documentation, the commands mode adds as
// "NAME first-argument".
func ModeCommands(mode Mode) []string {
	var out []string
	for name, arg := range modeForms[mode] {
		out = append(out, strings.TrimSpace(strings.ToUpper(name)+" "+arg))
	}
	return out
}

// modeAllows reports whether cmd with args is one of mode's forms.
func modeAllows(mode Mode, cmd string, args []interface{}) bool {
	forms := modeForms[mode]
	arg, ok := forms[strings.ToLower(cmd)]
	if !ok {
		return false
	}
	if arg == "" {
		return len(args) == 0
	}
	return len(args) >= 1 && strings.EqualFold(fmt.Sprint(args[0]), arg)
}
