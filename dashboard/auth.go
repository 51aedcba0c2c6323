package dashboard

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
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

	// After maxGuesses wrong tokens within guessWindow, every sign-in and
	// bearer request is refused until the oldest of them is that old.
	maxGuesses  = 20
	guessWindow = time.Minute
)

// guesses are the recent wrong tokens, to bound how fast a token can be
// guessed.
type guesses struct {
	mu    sync.Mutex
	times []time.Time
}

func (g *guesses) prune(now time.Time) {
	i := 0
	for i < len(g.times) && now.Sub(g.times[i]) >= guessWindow {
		i++
	}
	g.times = g.times[i:]
}

func (g *guesses) blocked(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.prune(now)
	return len(g.times) >= maxGuesses
}

func (g *guesses) wrong(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.prune(now)
	g.times = append(g.times, now)
}

// checkToken compares tok with the configured token, counting wrong ones;
// once too many were wrong lately it refuses even the right one.
func (d *Dashboard) checkToken(tok string) bool {
	now := d.opts.Now()
	if d.guess.blocked(now) {
		d.opts.Logger.Warn("dashboard: too many wrong tokens lately; refusing tokens for a while")
		return false
	}
	if equal(tok, d.opts.Token) {
		return true
	}
	d.guess.wrong(now)
	return false
}

// sessions are the browser sessions signed in with the token, in memory:
// a restart signs everyone out.
type sessions struct {
	mu sync.Mutex
	m  map[string]time.Time // id → expiry
}

func randomToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic("dashboard: crypto/rand: " + err.Error()) // never fails on supported systems
	}
	return hex.EncodeToString(b)
}

func (s *sessions) create(now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]time.Time{}
	}
	for id, exp := range s.m {
		if now.After(exp) {
			delete(s.m, id)
		}
	}
	for len(s.m) >= maxSessions {
		oldest, first := "", time.Time{}
		for id, exp := range s.m {
			if oldest == "" || exp.Before(first) {
				oldest, first = id, exp
			}
		}
		delete(s.m, oldest)
	}
	id := randomToken()
	s.m[id] = now.Add(sessionTTL)
	return id
}

func (s *sessions) valid(id string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.m[id]
	return ok && now.Before(exp)
}

func (s *sessions) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

func equal(a, b string) bool {
	return a != "" && len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// csrfToken is the request's double-submit value, set as a cookie when
// the browser has none yet.
func csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 48 {
		return c.Value
	}
	v := randomToken()
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
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

// authorized says whether r may change state: a request with the bearer
// token in its Authorization header (a browser never adds one to a
// cross-site request), or one from a signed-in session that carries the
// form's CSRF value, matching its cookie, from this origin.
func (d *Dashboard) authorized(r *http.Request) bool {
	if d.opts.Token == "" || d.opts.ReadOnly {
		return false
	}
	if t, ok := bearer(r); ok {
		return d.checkToken(t)
	}
	return d.signedIn(r) && d.csrfOK(r)
}

func (d *Dashboard) csrfOK(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	return err == nil && sameOrigin(r) && equal(r.PostFormValue(csrfField), c.Value)
}

func (d *Dashboard) signedIn(r *http.Request) bool {
	c, err := r.Cookie(sessionCookie)
	return err == nil && d.sess.valid(c.Value, d.opts.Now())
}
