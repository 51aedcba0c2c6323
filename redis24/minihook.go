package redis24

import (
	"github.com/alicebob/miniredis/v2/server"
)

// MiniHook returns a miniredis pre-hook (for Miniredis.Server().SetPreHook)
// that refuses every command or argument form that [Check] refuses: it answers
// "-ERR redis24: ..." without running the command, like a 2.4 server that does
// not know it. Inside MULTI the refused command is not queued and EXEC still
// runs the rest, which is what Redis 2.4 does too.
//
// onViolation, if not nil, is called on the miniredis connection goroutine for
// each refused command; the Violation has no Caller.
func MiniHook(onViolation func(*Violation)) server.Hook {
	return func(peer *server.Peer, cmd string, args ...string) bool {
		v := checkStrings(cmd, args)
		if v == nil {
			return false
		}
		if onViolation != nil {
			onViolation(v)
		}
		peer.WriteError("ERR " + v.Error())
		return true
	}
}
