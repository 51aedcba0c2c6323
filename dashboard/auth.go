package dashboard

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Cookie names. Both are HttpOnly and SameSite=Strict.
const (
	csrfCookie    = "bq_csrf"    // double-submit value every form carries
	sessionCookie = "bq_session" // set by signing in with the token
	csrfField     = "csrf"
)

const (
	sessionTTL  = 12 * time.Hour
	maxSessions = 1024 // the oldest is forgotten beyond this

	// After maxGuesses wrong tokens within guessWindow from one client
	// address, that address is refused (429) until the oldest of them is
	// that old. Other addresses are not affected: the right token from a
	// client that did not guess keeps working.
	maxGuesses  = 20
	guessWindow = time.Minute
	// maxGuessClients bounds the addresses remembered; beyond it the one
	// whose last wrong token is oldest is forgotten.
	maxGuessClients = 4096
)

// guesses are the recent wrong tokens of each client address, to bound
// how fast one client can guess the token.
type guesses struct {
	mu sync.Mutex
	m  map[string][]time.Time // client → times of its wrong tokens, oldest first
}

func pruneTimes(ts []time.Time, now time.Time) []time.Time {
	i := 0
	for i < len(ts) && now.Sub(ts[i]) >= guessWindow {
		i++
	}
	return ts[i:]
}

func (g *guesses) blocked(client string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts := pruneTimes(g.m[client], now)
	if len(ts) == 0 {
		delete(g.m, client)
		return false
	}
	g.m[client] = ts
	return len(ts) >= maxGuesses
}

func (g *guesses) wrong(client string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[string][]time.Time{}
	}
	ts, known := g.m[client]
	if !known && len(g.m) >= maxGuessClients {
		g.evict(now)
	}
	ts = pruneTimes(ts, now)
	if len(ts) >= maxGuesses {
		ts = ts[1:] // a blocked client's count stays at the limit
	}
	g.m[client] = append(ts, now)
}

// evict forgets the clients whose window passed, then, if the table is
// still full, the one whose last wrong token is oldest.
func (g *guesses) evict(now time.Time) {
	oldest, first := "", time.Time{}
	for c, ts := range g.m {
		last := ts[len(ts)-1]
		if now.Sub(last) >= guessWindow {
			delete(g.m, c)
			continue
		}
		if oldest == "" || last.Before(first) {
			oldest, first = c, last
		}
	}
	if len(g.m) >= maxGuessClients {
		delete(g.m, oldest)
	}
}

func (g *guesses) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.m)
}

// clientOf is the address a request's wrong tokens are counted against:
// its IP, or the /64 network for IPv6 (one host often has many of
// those addresses).
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

// errTooManyGuesses refuses a client that sent too many wrong tokens.
var errTooManyGuesses = errors.New("refused: too many wrong tokens from this address lately; try again in a minute")

// access is what a token or a session allows.
type access int

const (
	noAccess   access = iota
	readAccess        // pages and listings, no change (Options.ReadToken)
	fullAccess        // changes too (Options.Token)
)

// checkToken says what tok allows, counting wrong tokens against r's
// client; a client with too many wrong ones lately is refused with
// errTooManyGuesses whatever it sends. The token of a read-only
// dashboard allows reading only.
func (d *Dashboard) checkToken(r *http.Request, tok string) (access, error) {
	now := d.opts.Now()
	client := clientOf(r)
	if d.guess.blocked(client, now) {
		d.opts.Logger.Warn("dashboard: too many wrong tokens from this client lately; refusing it for a while", "client", client)
		return noAccess, errTooManyGuesses
	}
	switch {
	case equal(tok, d.opts.Token) && !d.opts.ReadOnly:
		return fullAccess, nil
	case equal(tok, d.opts.Token), equal(tok, d.opts.ReadToken):
		return readAccess, nil
	}
	d.guess.wrong(client, now)
	return noAccess, nil
}

// session is one browser signed in.
type session struct {
	exp time.Time
	acc access
}

// sessions are the browser sessions signed in with a token, in memory:
// a restart signs everyone out.
type sessions struct {
	mu sync.Mutex
	m  map[string]session // id → expiry and what it allows
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic("dashboard: crypto/rand: " + err.Error()) // never fails on supported systems
	}
	return hex.EncodeToString(b)
}

func (s *sessions) create(now time.Time, acc access) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]session{}
	}
	for id, se := range s.m {
		if now.After(se.exp) {
			delete(s.m, id)
		}
	}
	for len(s.m) >= maxSessions {
		oldest, first := "", time.Time{}
		for id, se := range s.m {
			if oldest == "" || se.exp.Before(first) {
				oldest, first = id, se.exp
			}
		}
		delete(s.m, oldest)
	}
	id := randomToken()
	s.m[id] = session{now.Add(sessionTTL), acc}
	return id
}

// access is what the session id allows: noAccess when it is unknown or
// expired.
func (s *sessions) access(id string, now time.Time) access {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.m[id]
	if !ok || !now.Before(se.exp) {
		return noAccess
	}
	return se.acc
}

func (s *sessions) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

func equal(a, b string) bool {
	return a != "" && len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// secure says whether r came over TLS, directly or through a proxy
// that says so (X-Forwarded-Proto: https), or the dashboard was told its
// cookies are always Secure. A client that forges the header only makes
// its own cookies Secure.
func (d *Dashboard) secure(r *http.Request) bool {
	return d.opts.SecureCookies || r.TLS != nil || strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https")
}

// setCookie sets c with the flags every cookie of the dashboard has.
func (d *Dashboard) setCookie(w http.ResponseWriter, r *http.Request, c *http.Cookie) {
	c.Path, c.HttpOnly, c.SameSite, c.Secure = "/", true, http.SameSiteStrictMode, d.secure(r)
	http.SetCookie(w, c)
}

// csrfToken is the request's double-submit value, set as a cookie when
// the browser has none yet.
func (d *Dashboard) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 48 {
		return c.Value
	}
	v := randomToken()
	d.setCookie(w, r, &http.Cookie{Name: csrfCookie, Value: v})
	// Later reads in this request see it too.
	r.AddCookie(&http.Cookie{Name: csrfCookie, Value: v})
	return v
}

// sameOrigin refuses requests a browser marks as coming from another
// site: Sec-Fetch-Site, when sent, must be same-origin (or none, typed by
// the user), and Origin, when sent, must name this host.
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	return true
}

// bearer is the token of an "Authorization: Bearer T" header.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:]), true
	}
	return "", false
}

// wantsJSON says whether r is a script's: it sends a bearer token or
// accepts JSON. Its errors are JSON too.
func wantsJSON(r *http.Request) bool {
	if _, ok := bearer(r); ok {
		return true
	}
	return strings.Contains(r.Header.Get("Accept"), "application/json")
}

// authorized says whether r may change state: a request with the bearer
// token in its Authorization header (a browser never adds one to a
// cross-site request), or one from a session signed in with the token
// that carries the form's CSRF value, matching its cookie, from this
// origin. The error is errTooManyGuesses for a client refused for its
// wrong tokens.
func (d *Dashboard) authorized(r *http.Request) (bool, error) {
	if !d.canAct() {
		return false, nil
	}
	if t, ok := bearer(r); ok {
		acc, err := d.checkToken(r, t)
		return acc == fullAccess, err
	}
	return d.session(r) == fullAccess && d.csrfOK(r), nil
}

// mayRead says whether r may see the dashboard: anyone when no read
// token is set, else a request with either token as its bearer token or
// a signed-in session.
func (d *Dashboard) mayRead(r *http.Request) (bool, error) {
	if d.opts.ReadToken == "" {
		return true, nil
	}
	if t, ok := bearer(r); ok {
		acc, err := d.checkToken(r, t)
		return acc != noAccess, err
	}
	return d.session(r) != noAccess, nil
}

func (d *Dashboard) csrfOK(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	return err == nil && sameOrigin(r) && equal(r.PostFormValue(csrfField), c.Value)
}

// session is what r's session cookie allows.
func (d *Dashboard) session(r *http.Request) access {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return noAccess
	}
	return d.sess.access(c.Value, d.opts.Now())
}
