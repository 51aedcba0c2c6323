package cluster

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/gomodule/redigo/redis"
)

// ErrCrossSlot is returned by [Router.Txn] when the keys of a transaction
// hash to more than one slot; nothing has been sent.
var ErrCrossSlot = errors.New("cluster: transaction keys span more than one hash slot")

// ErrNoKeys is returned by [Router.Txn] when it is given no key to route by.
var ErrNoKeys = errors.New("cluster: transaction has no key to route by")

// ErrTriesExhausted is returned by [Router.Do] and [Router.Txn] when every
// try ended in a redirection, a TRYAGAIN, a CLUSTERDOWN or an unreachable
// node. The last such error is wrapped too.
var ErrTriesExhausted = errors.New("cluster: tries used up following redirections")

// ErrNoSlotMap is returned when no node answered CLUSTER SLOTS, or the map
// it gave has no master for the slot asked for.
var ErrNoSlotMap = errors.New("cluster: no slot map")

// ErrClosed is returned by a [Router] after Close.
var ErrClosed = errors.New("cluster: router closed")

// Kinds of [Redirect].
const (
	KindMoved       = "MOVED"       // the slot lives on Addr now; refresh the map
	KindAsk         = "ASK"         // this key is being migrated to Addr: ASKING, then retry there once
	KindTryAgain    = "TRYAGAIN"    // a multi-key request during a migration; retry later
	KindClusterDown = "CLUSTERDOWN" // the cluster cannot serve the slot now; retry later
)

// Redirect is a cluster error reply after which a request can be sent again
// because the server did not run it.
type Redirect struct {
	Kind string // KindMoved, KindAsk, KindTryAgain or KindClusterDown
	Slot int    // for MOVED and ASK
	Addr string // host:port for MOVED and ASK; an empty host is filled from the node that answered
}

func (r *Redirect) Error() string {
	if r.Addr != "" {
		return fmt.Sprintf("cluster: %s %d %s", r.Kind, r.Slot, r.Addr)
	}
	return "cluster: " + r.Kind
}

// ParseRedirect finds a server error reply in err's chain and reports it as
// a Redirect when it is MOVED, ASK, TRYAGAIN or CLUSTERDOWN. from is the
// address of the node that answered; it fills an empty host in the reply.
func ParseRedirect(err error, from string) (*Redirect, bool) {
	var re redis.Error
	if !errors.As(err, &re) {
		return nil, false
	}
	f := strings.Fields(string(re))
	if len(f) == 0 {
		return nil, false
	}
	switch f[0] {
	case KindTryAgain, KindClusterDown:
		return &Redirect{Kind: f[0]}, true
	case KindMoved, KindAsk:
		if len(f) < 3 {
			return nil, false
		}
		slot, err := strconv.Atoi(f[1])
		if err != nil || slot < 0 || slot >= Slots {
			return nil, false
		}
		addr := f[2]
		if host, port, err := net.SplitHostPort(addr); err == nil && host == "" {
			if fh, _, err := net.SplitHostPort(from); err == nil {
				addr = net.JoinHostPort(fh, port)
			}
		}
		return &Redirect{Kind: f[0], Slot: slot, Addr: addr}, true
	}
	return nil, false
}
