// Package minihook puts the Redis 2.4 check of package redis24 in front of
// a miniredis server, for tests and the embedded demo. It lives apart from
// redis24 so that programs using the engine do not build miniredis in.
package minihook

import (
	"errors"

	"github.com/alicebob/miniredis/v2/server"
	"github.com/bucketq/bucketq/redis24"
)

// Hook returns a miniredis pre-hook (for Miniredis.Server().SetPreHook)
// that refuses every command or argument form that redis24.Check refuses:
// it answers "-ERR redis24: ..." without running the command, like a 2.4
// server that does not know it. Inside MULTI the refused command is not
// queued and EXEC still runs the rest, which is what Redis 2.4 does too.
//
// onViolation, if not nil, is called on the miniredis connection goroutine
// for each refused command; the Violation has no Caller.
func Hook(onViolation func(*redis24.Violation)) server.Hook {
	return func(peer *server.Peer, cmd string, args ...string) bool {
		iargs := make([]interface{}, len(args))
		for i, a := range args {
			iargs[i] = a
		}
		err := redis24.Check(cmd, iargs...)
		if err == nil {
			return false
		}
		var v *redis24.Violation
		if errors.As(err, &v) {
			v.Caller = "" // a frame of the server's goroutine says nothing
			if onViolation != nil {
				onViolation(v)
			}
		}
		peer.WriteError("ERR " + err.Error())
		return true
	}
}
