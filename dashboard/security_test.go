package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bucketq/bucketq/engine"
)

// fakeBackend serves fixed tasks from memory. When gate is set, ListTasks
// reports its start on entered and waits for gate to close.
type fakeBackend struct {
	mu      sync.Mutex
	tasks   []*engine.TaskInfo
	entered chan struct{}
	gate    chan struct{}
	acted   int
	limits  []engine.QueueConfig
}

func (f *fakeBackend) Queues(context.Context) ([]engine.QueueInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]bool{}
	var out []engine.QueueInfo
	for _, t := range f.tasks {
		if !seen[t.Queue] {
			seen[t.Queue] = true
			out = append(out, engine.QueueInfo{Queue: t.Queue, Scheduled: 1, Dead: 1})
		}
	}
	return out, nil
}

func (f *fakeBackend) ListTasks(ctx context.Context, o engine.ListOptions) (*engine.TaskPage, error) {
	if f.gate != nil {
		f.entered <- struct{}{}
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := &engine.TaskPage{}
	for _, t := range f.tasks {
		if (o.Queue == "" || t.Queue == o.Queue) && t.State == o.State {
			p.Tasks = append(p.Tasks, t)
		}
	}
	p.Total = int64(len(p.Tasks))
	return p, nil
}

func (f *fakeBackend) Task(_ context.Context, id string) (*engine.TaskInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.tasks {
		if t.ID == id {
			return t, nil
		}
	}
	return nil, fmt.Errorf("task %s: %w", id, engine.ErrNotFound)
}

func (f *fakeBackend) Workers(context.Context) ([]engine.WorkerInfo, error) { return nil, nil }

func (f *fakeBackend) Act(_ context.Context, _ engine.Action, ids ...string) (engine.ActionResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acted++
	return engine.ActionResult{Done: len(ids)}, nil
}

func (f *fakeBackend) ActAll(context.Context, engine.Action, engine.Filter) (engine.ActionResult, error) {
	return engine.ActionResult{}, nil
}
func (f *fakeBackend) Periodics(context.Context) ([]engine.PeriodicStatus, error) { return nil, nil }
func (f *fakeBackend) MemoryPolicy(context.Context) (engine.MemoryPolicy, error) {
	return engine.MemoryPolicy{MaxMemory: 1 << 30, Policy: "allkeys-lru"}, nil
}
func (f *fakeBackend) PauseQueue(context.Context, string) error  { return nil }
func (f *fakeBackend) ResumeQueue(context.Context, string) error { return nil }
func (f *fakeBackend) SetQueueLimits(_ context.Context, qc engine.QueueConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limits = append(f.limits, qc)
	return nil
}
func (f *fakeBackend) Result(context.Context, string) ([]byte, error) { return nil, nil }
func (f *fakeBackend) Workflow(_ context.Context, id string) (*engine.WorkflowInfo, error) {
	return nil, fmt.Errorf("workflow %s: %w", id, engine.ErrNotFound)
}

const testToken = "right-token-0123456789"

// clock is a settable clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestDashboard(t *testing.T, b Backend, opts Options) *Dashboard {
	t.Helper()
	d, err := New(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// do serves one request from remote (host:port) and returns the response.
func do(d http.Handler, method, target, remote string, body io.Reader, hdr map[string]string) *http.Response {
	r := httptest.NewRequest(method, target, body)
	if remote != "" {
		r.RemoteAddr = remote
	}
	if body != nil && r.Header.Get("Content-Type") == "" {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	d.ServeHTTP(w, r)
	return w.Result()
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A sign-in's return address is a path of this origin, whatever the
// next parameter says: the exact input of the report and its variants
// all go to "/".
func TestSafeReturnSameOrigin(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"/\t/evil.example/x", "//evil", "/\\evil", "/%2F/evil", "/%2f/evil", "/%5C/evil", "https://evil",
		"\t//evil", "/\n/evil", "/\r\n/evil", "/\x00/evil", " //evil", "javascript:alert(1)",
		"/\u0085/evil", "", "evil", "\\\\evil", "/\\/evil",
	} {
		if got := safeReturn(bad); got != "/" {
			t.Errorf("safeReturn(%q) = %q, want /", bad, got)
		}
	}
	for _, good := range []string{"/", "/queues/default?state=dead", "/tasks/abc%20d", "/dead?q=a%2Fb"} {
		if got := safeReturn(good); got != good {
			t.Errorf("safeReturn(%q) = %q, want it kept", good, got)
		}
	}

	// Through the sign-in itself: the form carries the cleaned value and
	// the redirect after it names no other host.
	d := newTestDashboard(t, &fakeBackend{}, Options{Token: testToken})
	resp := do(d, "GET", "/login?next=/%09/evil.example/x", "", nil, nil)
	page := readBody(t, resp)
	if !strings.Contains(page, `name="next" value="/"`) {
		t.Errorf("the sign-in form does not carry next=/: %s", page)
	}
	csrf := cookieValue(resp, csrfCookie)
	form := url.Values{"csrf": {csrf}, "token": {testToken}, "next": {"/\t/evil.example/x"}}
	resp = do(d, "POST", "/login", "", strings.NewReader(form.Encode()),
		map[string]string{"Cookie": csrfCookie + "=" + csrf})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Errorf("sign-in with a foreign next: %d to %q, want 303 to /", resp.StatusCode, resp.Header.Get("Location"))
	}
}

func cookieValue(resp *http.Response, name string) string {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

func cookieOf(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Wrong tokens from one address lock out that address only: the right
// token from another still works, and the locked one gets 429 until its
// window passes. The addresses remembered are bounded.
func TestWrongTokensLockOutOneClient(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	d := newTestDashboard(t, &fakeBackend{}, Options{Token: testToken, Now: clk.now})
	pause := func(remote, tok string) int {
		resp := do(d, "POST", "/queues/default/pause", remote, strings.NewReader(""),
			map[string]string{"Authorization": "Bearer " + tok})
		return resp.StatusCode
	}
	for i := range 21 {
		if code := pause("198.51.100.7:4000", fmt.Sprintf("wrong%d", i)); code != http.StatusForbidden && code != http.StatusTooManyRequests {
			t.Fatalf("wrong token %d: %d", i, code)
		}
	}
	if code := pause("203.0.113.9:5000", testToken); code != http.StatusOK {
		t.Errorf("the right token from another client after 21 wrong ones: %d, want 200", code)
	}
	if code := pause("198.51.100.7:4001", testToken); code != http.StatusTooManyRequests {
		t.Errorf("the guessing client: %d, want 429", code)
	}
	clk.add(guessWindow)
	if code := pause("198.51.100.7:4002", testToken); code != http.StatusOK {
		t.Errorf("the guessing client once its window passed: %d, want 200", code)
	}
	// Many addresses: the table stays bounded.
	for i := range maxGuessClients + 100 {
		pause(fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255), "wrong")
	}
	if n := d.guess.size(); n > maxGuessClients {
		t.Errorf("%d addresses remembered, want at most %d", n, maxGuessClients)
	}
}

// isHidden reports whether r would display as something else than
// itself: a bidi control, a C0 or C1 control, an invisible format mark.
func isHidden(r rune) bool {
	switch {
	case r < 0x20 && r != '\n' && r != '\t' && r != '\r', r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r >= 0x200b && r <= 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069,
		r == 0x2028, r == 0x2029, r == 0x2060, r == 0xfeff:
		return true
	}
	return false
}

var valueAttr = regexp.MustCompile(`(value|href|action)="[^"]*"`)

// Types, queues, ids, errors and payloads with bidi or C1 controls show
// those controls as \uXXXX on every page; form values keep them as they
// are (they name the task).
func TestBidiAndControlsShownEscaped(t *testing.T) {
	t.Parallel()
	now := time.Now()
	mk := func(id string, st engine.State) *engine.TaskInfo {
		return &engine.TaskInfo{Task: engine.Task{ID: id, Queue: "default",
			Type: "invoice\u202Efdp.exe", Payload: []byte("pay\u2067load\u0085 \x1b[31m"), LastError: "err\u202Dor\u200F",
			Created: now, Due: now, MaxAttempts: 3}, State: st, Worker: "w\u2066x"}
	}
	fb := &fakeBackend{tasks: []*engine.TaskInfo{mk("sched-1", engine.StateScheduled), mk("dead-1", engine.StateDead),
		mk("retry-1", engine.StateRetrying), mk("run-1", engine.StateRunning)}}
	d := newTestDashboard(t, fb, Options{Token: testToken})
	for _, path := range []string{"/queues/default?state=scheduled", "/queues/default?state=dead",
		"/queues/default?state=retrying", "/queues/default?state=running", "/dead", "/tasks/sched-1", "/tasks/dead-1",
		"/queues/default?state=scheduled&q=x%E2%80%AEy"} {
		resp := do(d, "GET", path, "", nil, nil)
		page := readBody(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, page)
		}
		shown := valueAttr.ReplaceAllString(page, "")
		for i, r := range shown {
			if isHidden(r) {
				t.Errorf("GET %s: %U shown raw near %q", path, r, shown[max(0, i-40):min(len(shown), i+40)])
				break
			}
		}
		if !strings.Contains(page, `invoice\u202Efdp.exe`) {
			t.Errorf("GET %s: the type is not shown as invoice\\u202Efdp.exe", path)
		}
	}
}

// /login reads a small body only, and no multipart form at all.
func TestLoginBodyBounded(t *testing.T) {
	t.Parallel()
	d := newTestDashboard(t, &fakeBackend{}, Options{Token: testToken})
	big := url.Values{"token": {strings.Repeat("x", 1<<20)}}.Encode()
	if resp := do(d, "POST", "/login", "", strings.NewReader(big), nil); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a 1 MiB sign-in form: %d, want 413", resp.StatusCode)
	}
	var b strings.Builder
	mw := multipart.NewWriter(&b)
	_ = mw.WriteField("token", testToken)
	_ = mw.Close()
	resp := do(d, "POST", "/login", "", strings.NewReader(b.String()), map[string]string{"Content-Type": mw.FormDataContentType()})
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("a multipart sign-in form: %d, want 415", resp.StatusCode)
	}
}

// Cookies are Secure over TLS, behind a proxy that says https, and with
// SecureCookies.
func TestCookiesSecure(t *testing.T) {
	t.Parallel()
	d := newTestDashboard(t, &fakeBackend{}, Options{Token: testToken})
	if c := cookieOf(do(d, "GET", "/login", "", nil, map[string]string{"X-Forwarded-Proto": "https"}), csrfCookie); c == nil || !c.Secure {
		t.Errorf("behind a TLS proxy: csrf cookie %v, want Secure", c)
	}
	if c := cookieOf(do(d, "GET", "/login", "", nil, nil), csrfCookie); c == nil || c.Secure {
		t.Errorf("plain HTTP: csrf cookie %v, want not Secure", c)
	}
	ds := newTestDashboard(t, &fakeBackend{}, Options{Token: testToken, SecureCookies: true})
	if c := cookieOf(do(ds, "GET", "/login", "", nil, nil), csrfCookie); c == nil || !c.Secure {
		t.Errorf("with SecureCookies: csrf cookie %v, want Secure", c)
	}
}

// Scripts get JSON errors: a wrong bearer token, a bad request, and any
// request that asks for JSON.
func TestScriptsGetJSONErrors(t *testing.T) {
	t.Parallel()
	d := newTestDashboard(t, &fakeBackend{}, Options{Token: testToken})
	cases := []struct {
		name, path string
		hdr        map[string]string
		form       url.Values
		code       int
	}{
		{"wrong bearer", "/actions", map[string]string{"Authorization": "Bearer nope"}, url.Values{"verb": {"run"}, "id": {"a"}}, 403},
		{"unknown verb", "/actions", map[string]string{"Authorization": "Bearer " + testToken}, url.Values{"verb": {"fly"}, "id": {"a"}}, 400},
		{"no token, asks JSON", "/actions", map[string]string{"Accept": "application/json"}, url.Values{"verb": {"run"}, "id": {"a"}}, 403},
		{"pause, wrong bearer", "/queues/default/pause", map[string]string{"Authorization": "Bearer nope"}, nil, 403},
		{"limits, wrong bearer", "/queues/default/limits", map[string]string{"Authorization": "Bearer nope"}, url.Values{"max_running": {"3"}}, 403},
		{"limits, bad number", "/queues/default/limits", map[string]string{"Authorization": "Bearer " + testToken}, url.Values{"max_running": {"-3"}}, 400},
	}
	for _, c := range cases {
		resp := do(d, "POST", c.path, "192.0.2.1:1", strings.NewReader(c.form.Encode()), c.hdr)
		body := readBody(t, resp)
		var v struct {
			Error string `json:"error"`
		}
		if resp.StatusCode != c.code || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") ||
			json.Unmarshal([]byte(body), &v) != nil || v.Error == "" {
			t.Errorf("%s: %d %s %q, want %d and a JSON error", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), body, c.code)
		}
	}
}

// At most maxScans listings or searches run at once: one more is
// answered 503 at once, without reaching the backend, and the others
// finish.
func TestScansInFlightBounded(t *testing.T) {
	t.Parallel()
	fb := &fakeBackend{tasks: []*engine.TaskInfo{{Task: engine.Task{ID: "a", Queue: "bigq", Type: "t"},
		State: engine.StateScheduled}}, entered: make(chan struct{}, 2*maxScans), gate: make(chan struct{})}
	d := newTestDashboard(t, fb, Options{})
	const path = "/queues/bigq?state=scheduled&q=zzzz"
	results := make(chan int, maxScans)
	for range maxScans {
		go func() { results <- do(d, "GET", path, "", nil, nil).StatusCode }()
	}
	for range maxScans {
		<-fb.entered
	}
	extra := make(chan *http.Response, 1)
	go func() { extra <- do(d, "GET", path, "", nil, nil) }()
	select {
	case <-fb.entered:
		t.Fatalf("a scan beyond the %d in flight reached the backend", maxScans)
	case resp := <-extra:
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("a scan beyond the bound: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	close(fb.gate)
	for range maxScans {
		if code := <-results; code != http.StatusOK {
			t.Errorf("a scan within the bound: %d, want 200", code)
		}
	}
	if code := do(d, "GET", path, "", nil, nil).StatusCode; code != http.StatusOK {
		t.Errorf("a scan once the others finished: %d, want 200", code)
	}
}

// The read token is needed to see anything, allows no change, and lets
// a browser sign in to look; the token allows everything.
func TestReadToken(t *testing.T) {
	t.Parallel()
	const readTok = "read-token-abcdef0123"
	fb := &fakeBackend{tasks: []*engine.TaskInfo{{Task: engine.Task{ID: "t1", Queue: "default",
		Type: "secret.type", Payload: []byte("secret payload")}, State: engine.StateScheduled}}}
	d := newTestDashboard(t, fb, Options{Token: testToken, ReadToken: readTok})
	bearerOf := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	for _, path := range []string{"/", "/queues/default?state=scheduled", "/tasks/t1", "/dead", "/workers", "/periodic"} {
		resp := do(d, "GET", path, "", nil, nil)
		body := readBody(t, resp)
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login?next=") ||
			strings.Contains(body, "secret") {
			t.Errorf("GET %s without a token: %d to %q, want 303 to the sign-in page", path, resp.StatusCode, resp.Header.Get("Location"))
		}
		if resp := do(d, "GET", path, "", nil, bearerOf("wrong")); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token: %d, want 401", path, resp.StatusCode)
		}
		for _, tok := range []string{readTok, testToken} {
			if resp := do(d, "GET", path, "", nil, bearerOf(tok)); resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s with a token: %d, want 200", path, resp.StatusCode)
			}
		}
	}
	if resp := do(d, "GET", "/tasks/t1", "", nil, bearerOf(readTok)); !strings.Contains(readBody(t, resp), "secret payload") {
		t.Errorf("the read token does not show the payload")
	}
	act := url.Values{"verb": {"run"}, "id": {"t1"}}.Encode()
	if resp := do(d, "POST", "/actions", "", strings.NewReader(act), bearerOf(readTok)); resp.StatusCode != http.StatusForbidden {
		t.Errorf("an action with the read token: %d, want 403", resp.StatusCode)
	}
	if resp := do(d, "POST", "/actions", "", strings.NewReader(act), bearerOf(testToken)); resp.StatusCode != http.StatusOK {
		t.Errorf("an action with the token: %d, want 200", resp.StatusCode)
	}
	// A browser signs in with the read token: it sees the pages, is
	// offered no action, and its forms are refused.
	resp := do(d, "GET", "/login", "", nil, nil)
	csrf := cookieValue(resp, csrfCookie)
	form := url.Values{"csrf": {csrf}, "token": {readTok}, "next": {"/tasks/t1"}}
	resp = do(d, "POST", "/login", "", strings.NewReader(form.Encode()), map[string]string{"Cookie": csrfCookie + "=" + csrf})
	sess := cookieValue(resp, sessionCookie)
	if resp.StatusCode != http.StatusSeeOther || sess == "" {
		t.Fatalf("sign-in with the read token: %d, no session", resp.StatusCode)
	}
	cookies := map[string]string{"Cookie": csrfCookie + "=" + csrf + "; " + sessionCookie + "=" + sess}
	resp = do(d, "GET", "/tasks/t1", "", nil, cookies)
	page := readBody(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "secret payload") || strings.Contains(page, `action="/actions"`) {
		t.Errorf("a reader's task page: %d, want the page without actions", resp.StatusCode)
	}
	act = url.Values{"verb": {"run"}, "id": {"t1"}, "csrf": {csrf}}.Encode()
	if resp := do(d, "POST", "/actions", "", strings.NewReader(act), cookies); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a reader's action: %d, want 403", resp.StatusCode)
	}
	// Guard: what a process mounts beside the dashboard (/metrics).
	g := d.Guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "metrics") }))
	if resp := do(g, "GET", "/metrics", "", nil, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: %d, want 401", resp.StatusCode)
	}
	if resp := do(g, "GET", "/metrics", "", nil, bearerOf(readTok)); resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics with the read token: %d, want 200", resp.StatusCode)
	}
	open := newTestDashboard(t, fb, Options{Token: testToken})
	if resp := do(open.Guard(g), "GET", "/metrics", "", nil, nil); resp.StatusCode != http.StatusUnauthorized {
		// g still wants the read token of d; open's Guard lets anything through.
		t.Errorf("an open Guard over d's: %d, want d's 401", resp.StatusCode)
	}
	if resp := do(open, "GET", "/tasks/t1", "", nil, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("without a read token the pages are open: %d, want 200", resp.StatusCode)
	}
}

// TestOverviewShowsMemoryPolicy: the overview says what Redis does when it
// is full, marked when it evicts task records.
func TestOverviewShowsMemoryPolicy(t *testing.T) {
	t.Parallel()
	d := newTestDashboard(t, &fakeBackend{}, Options{Token: testToken})
	page := readBody(t, do(d, "GET", "/", "", nil, nil))
	if !strings.Contains(page, `Redis memory: <span class="bad">maxmemory 1073741824 bytes, policy allkeys-lru: tasks can be evicted and lost</span>`) {
		t.Errorf("the overview does not show the evicting policy marked:\n%s", page)
	}
}

// The limits form sets every limit of the queue at once, empty fields
// removing theirs, only with the token.
func TestSetLimits(t *testing.T) {
	t.Parallel()
	fb := &fakeBackend{}
	d := newTestDashboard(t, fb, Options{Token: testToken})
	form := url.Values{"max_running": {"3"}, "rate": {"10/1s"}, "key_max_running": {""}, "key_rate": {"2/1s"}}
	resp := do(d, "POST", "/queues/mail/limits", "192.0.2.1:1", strings.NewReader(form.Encode()),
		map[string]string{"Authorization": "Bearer " + testToken})
	if body := readBody(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"rate":"10/1s"`) {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	want := engine.QueueConfig{Name: "mail", MaxRunning: 3, Rate: "10/1s", KeyRate: "2/1s"}
	if len(fb.limits) != 1 || fb.limits[0] != want {
		t.Fatalf("limits set %+v, want %+v", fb.limits, want)
	}
}
