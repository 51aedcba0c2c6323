package chaos

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// CutPolicy says when the proxy cuts a connection. Probabilities are per
// command seen from the client; a cut closes both sides.
type CutPolicy struct {
	Before float64 // any command: dropped, then the connection is cut
	After  float64 // any command: forwarded, then the connection is cut (its reply is lost)
	// ExecBefore and ExecAfter are for EXEC: cut with MULTI ... queued
	// commands delivered but not EXEC (the server discards them), or cut
	// right after EXEC (it ran; the client never learns the result).
	ExecBefore, ExecAfter float64
	// PopAfter is for RPOPLPUSH: cut after the server moved an id.
	PopAfter float64
	// Blocked is for BLPOP: cut while it may still be blocked, after a
	// random 0-1.5 s.
	Blocked float64
	// RandomEvery is the mean interval between cuts of a random live
	// connection at a random moment; 0 for none.
	RandomEvery time.Duration
}

// proxy is a TCP proxy between the engine's processes and Redis that
// cuts connections as its policy says, while enabled.
type proxy struct {
	ln       net.Listener
	upstream string
	policy   CutPolicy

	enabled atomic.Bool
	mu      sync.Mutex
	rng     *rand.Rand
	conns   map[*pconn]struct{}
	cuts    map[string]int
	wg      sync.WaitGroup
	stop    chan struct{}
}

type pconn struct {
	c, u   net.Conn
	once   sync.Once
	closed atomic.Bool
}

func (pc *pconn) close() {
	pc.once.Do(func() {
		pc.closed.Store(true)
		pc.c.Close()
		pc.u.Close()
	})
}

func newProxy(upstream string, policy CutPolicy, seed uint64) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, upstream: upstream, policy: policy,
		rng:   rand.New(rand.NewPCG(seed, 0x70c5)),
		conns: map[*pconn]struct{}{}, cuts: map[string]int{}, stop: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	if policy.RandomEvery > 0 {
		p.wg.Add(1)
		go p.randomCuts()
	}
	return p, nil
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy and closes every connection.
func (p *proxy) Close() {
	close(p.stop)
	p.ln.Close()
	p.mu.Lock()
	for pc := range p.conns {
		pc.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Cuts returns the cuts made so far by kind, and their total.
func (p *proxy) Cuts() (map[string]int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	total := 0
	for k, v := range p.cuts {
		out[k] = v
		total += v
	}
	return out, total
}

func (p *proxy) chance(prob float64) bool {
	if prob <= 0 || !p.enabled.Load() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64() < prob
}

func (p *proxy) count(kind string) {
	p.mu.Lock()
	p.cuts[kind]++
	p.mu.Unlock()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		pc := &pconn{c: c, u: u}
		p.mu.Lock()
		p.conns[pc] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(c, u)
			pc.close()
		}()
		go func() {
			defer p.wg.Done()
			p.forward(pc)
			pc.close()
			p.mu.Lock()
			delete(p.conns, pc)
			p.mu.Unlock()
		}()
	}
}

func (p *proxy) randomCuts() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		d := time.Duration(p.rng.ExpFloat64() * float64(p.policy.RandomEvery))
		p.mu.Unlock()
		select {
		case <-p.stop:
			return
		case <-time.After(d):
		}
		if !p.enabled.Load() {
			continue
		}
		p.mu.Lock()
		all := make([]*pconn, 0, len(p.conns))
		for pc := range p.conns {
			all = append(all, pc)
		}
		// Map order is random but not seeded; sort for a stable pick.
		sort.Slice(all, func(i, j int) bool {
			return all[i].c.RemoteAddr().String() < all[j].c.RemoteAddr().String()
		})
		var victim *pconn
		if len(all) > 0 {
			victim = all[p.rng.IntN(len(all))]
			p.cuts["random"]++
		}
		p.mu.Unlock()
		if victim != nil {
			victim.close()
		}
	}
}

// forward copies client to server command by command, cutting as the
// policy says.
func (p *proxy) forward(pc *pconn) {
	buf := make([]byte, 0, 64<<10)
	tmp := make([]byte, 32<<10)
	for {
		n, err := pc.c.Read(tmp)
		if n > 0 {
			buf = append(buf, tmp[:n]...)
			var out []byte
			cut := false
			at := 0
			for !cut {
				name, size, ok := parseCommand(buf[at:])
				if !ok {
					break
				}
				cmd := buf[at : at+size]
				at += size
				switch {
				case name == "EXEC" && p.chance(p.policy.ExecBefore):
					p.count("before EXEC")
					cut = true
				case p.chance(p.policy.Before):
					p.count("before " + name)
					cut = true
				case name == "EXEC" && p.chance(p.policy.ExecAfter):
					p.count("after EXEC")
					out, cut = append(out, cmd...), true
				case name == "RPOPLPUSH" && p.chance(p.policy.PopAfter):
					p.count("after RPOPLPUSH")
					out, cut = append(out, cmd...), true
				case p.chance(p.policy.After):
					p.count("after " + name)
					out, cut = append(out, cmd...), true
				default:
					out = append(out, cmd...)
					if name == "BLPOP" && p.chance(p.policy.Blocked) {
						p.mu.Lock()
						d := time.Duration(p.rng.Int64N(int64(1500 * time.Millisecond)))
						p.mu.Unlock()
						time.AfterFunc(d, func() {
							if !pc.closed.Load() && p.enabled.Load() {
								p.count("during BLPOP")
								pc.close()
							}
						})
					}
				}
			}
			if !cut && at < len(buf) && buf[at] != '*' {
				// Not RESP (an inline command): pass it through.
				out = append(out, buf[at:]...)
				at = len(buf)
			}
			if len(out) > 0 {
				if _, werr := pc.u.Write(out); werr != nil {
					return
				}
			}
			if cut {
				return
			}
			buf = append(buf[:0], buf[at:]...)
		}
		if err != nil {
			return
		}
	}
}

// parseCommand parses one RESP array of bulk strings at the start of b and
// returns its command name (upper case) and size, or ok false when b does
// not hold a whole command yet.
func parseCommand(b []byte) (name string, size int, ok bool) {
	line := func(at int) (int64, int, bool) {
		i := bytes.Index(b[at:], []byte("\r\n"))
		if i < 1 {
			return 0, 0, false
		}
		v, err := strconv.ParseInt(string(b[at+1:at+i]), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		return v, at + i + 2, true
	}
	if len(b) == 0 || b[0] != '*' {
		return "", 0, false
	}
	n, at, ok := line(0)
	if !ok {
		return "", 0, false
	}
	for i := int64(0); i < n; i++ {
		if at >= len(b) || b[at] != '$' {
			return "", 0, false
		}
		l, next, ok := line(at)
		if !ok || l < 0 || int64(len(b)) < int64(next)+l+2 {
			return "", 0, false
		}
		if i == 0 {
			name = string(bytes.ToUpper(b[next : next+int(l)]))
		}
		at = next + int(l) + 2
	}
	return name, at, true
}
