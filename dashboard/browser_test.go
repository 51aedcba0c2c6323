package dashboard_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bucketq/bucketq/dashboard"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/httpserver"
	"github.com/bucketq/bucketq/internal/redistest"
	"github.com/bucketq/bucketq/internal/testwait"
	"github.com/chromedp/chromedp"
)

// The browser tests drive Debian's chromium (scripts/test.sh installs it)
// with chromedp. -screenshots DIR keeps a PNG of each page in DIR (the
// README's come from `go test ./dashboard -run TestBrowserPages
// -screenshots ../docs/img`).
var screenshots = flag.String("screenshots", "", "write the pages' screenshots to this directory")

const token = "s3cret-token-for-tests"

// env is a real Redis with tasks in every state, an engine server working
// on them, and the dashboard served over HTTP.
type env struct {
	t      *testing.T
	client *engine.Client
	in     *engine.Inspector
	base   string // http://127.0.0.1:port
	ids    map[string][]string
	fixed  atomic.Bool   // "broken" tasks succeed once set
	ran    chan string   // ids of "broken" tasks that succeeded
	hold   chan struct{} // closed at the end: releases the running task
}

func newEnv(t *testing.T, opts dashboard.Options) *env {
	t.Helper()
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	cfg := engine.DefaultConfig()
	cfg.Namespace = redistest.Namespace(t)
	t.Cleanup(func() { srv.Cleanup(t, cfg.Namespace) })
	cfg.Queues = []engine.QueueConfig{{Name: "default", Weight: 1}, {Name: "emails", Weight: 1}}
	cfg.RetryDelay = func(*engine.Task, int, error) time.Duration { return time.Hour }
	cfg.Advanced.HeartbeatInterval, cfg.Advanced.HeartbeatTTL = time.Second, 3*time.Second
	client, err := engine.NewClient(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	in, err := engine.NewInspector(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, client: client, in: in, ids: map[string][]string{}, ran: make(chan string, 16), hold: make(chan struct{})}

	mux := engine.NewMux()
	started := make(chan struct{}, 1)
	mux.HandleFunc("hold", func(ctx context.Context, _ *engine.Task) error {
		started <- struct{}{}
		select {
		case <-e.hold:
		case <-ctx.Done():
		}
		return nil
	})
	mux.HandleFunc("flaky", func(context.Context, *engine.Task) error {
		return errors.New("upstream answered 503 Service Unavailable")
	})
	mux.HandleFunc("broken", func(_ context.Context, t *engine.Task) error {
		if e.fixed.Load() {
			e.ran <- t.ID
			return nil
		}
		return engine.Permanent(errors.New("template \"welcome\" not found: " + strings.Repeat("a very long reason ", 12)))
	})
	mux.HandleFunc("email.send", func(context.Context, *engine.Task) error { return nil })
	es, err := engine.NewServer(cfg, mux, engine.RoleDispatcher|engine.RoleReaper|engine.RoleWorker, pool)
	if err != nil {
		t.Fatal(err)
	}
	// A periodic entry whose next firing is hours away (none enqueued).
	if err := es.AddPeriodic(engine.Periodic{Name: "nightly report", Cron: "0 3 * * *", Location: "Europe/Berlin",
		Type: "email.send", Queue: "emails"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = es.Run(ctx) }()
	t.Cleanup(func() {
		close(e.hold)
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		_ = es.Shutdown(sctx)
		cancel()
		<-done
	})

	bg := context.Background()
	add := func(kind, typ string, payload string, opts ...engine.Option) string {
		ti, err := client.Enqueue(bg, typ, []byte(payload), opts...)
		if err != nil {
			t.Fatalf("enqueue %s: %v", kind, err)
		}
		e.ids[kind] = append(e.ids[kind], ti.ID)
		return ti.ID
	}
	// Done, then dead and retrying (their runs fail), then running.
	add("done", "email.send", `{"to":"ada@example.com"}`, engine.Queue("emails"))
	add("dead", "broken", `{"to":"bob@example.com","template":"welcome"}`, engine.Queue("emails"))
	add("retrying", "flaky", `{"url":"https://example.com/hook"}`)
	add("running", "hold", "binary\x00\x01\x02\xff payload")
	<-started
	// Scheduled: some to cancel by a search, some to keep, one with a
	// long id and payload.
	for i := range 3 {
		add("cancel-me", "report.build", fmt.Sprintf(`{"batch":"cancel-me","n":%d}`, i), engine.In(time.Hour))
		add("keep", "report.build", fmt.Sprintf(`{"batch":"keep","n":%d}`, i), engine.In(2*time.Hour))
	}
	add("long", "report.build."+strings.Repeat("x", 80), `{"blob":"`+strings.Repeat("0123456789", 60)+`"}`,
		engine.In(3*time.Hour), engine.TaskID("order-"+strings.Repeat("7", 100)))
	// Ready: a queue no worker serves.
	for i := range 4 {
		add("ready", "thumbnail", fmt.Sprintf(`{"image":"img-%d.png","sizes":[64,128,256]}`, i), engine.Queue("images"))
	}
	e.await(func() bool {
		return e.state(e.ids["done"][0]) == engine.StateDone && e.state(e.ids["dead"][0]) == engine.StateDead &&
			e.state(e.ids["retrying"][0]) == engine.StateRetrying
	}, "tasks in every state")

	d, err := dashboard.New(in, opts)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := httpserver.New(httpserver.Options{Addr: "127.0.0.1:0", Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	hs.Handle("/", d)
	ln, err := hs.Listen()
	if err != nil {
		t.Fatal(err)
	}
	hctx, hcancel := context.WithCancel(context.Background())
	hdone := make(chan struct{})
	go func() { defer close(hdone); _ = hs.Serve(hctx, ln) }()
	go func() { _ = d.Run(hctx) }()
	t.Cleanup(func() { hcancel(); <-hdone })
	e.base = "http://" + ln.Addr().String()
	return e
}

func (e *env) state(id string) engine.State {
	ti, err := e.client.Lookup(context.Background(), id)
	if err != nil {
		e.t.Fatalf("lookup %s: %v", id, err)
	}
	return ti.State
}

// await polls cond (state in Redis) for up to 10 s.
func (e *env) await(cond func() bool, what string) {
	e.t.Helper()
	testwait.Until(e.t, 10*time.Second, what, cond)
}

// browser starts a headless Chromium with a fresh profile, at laptop size.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (scripts/test.sh installs Debian's chromium): %v", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1366, 768),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true), chromedp.Flag("mute-audio", true),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	// Every page must load without a console error: a script error, a
	// resource that failed, or a request the Content-Security-Policy
	// refused (Chromium logs those as errors).
	var mu sync.Mutex
	var errs []string
	lctx, stop := context.WithCancel(ctx)
	messages := chromedp.Console(lctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("%s (%s)", m.Text, m.URL))
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, e := range errs {
			t.Errorf("browser console: %s", e)
		}
	})
	return ctx
}

func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// text is the visible text of the page's main element.
func text(t *testing.T, ctx context.Context) string {
	t.Helper()
	return value(t, ctx, "read the page", chromedp.Text(chromedp.CSS("main")))
}

// shot saves the window (1366×768) as name.png.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png := value(t, ctx, "screenshot "+name, chromedp.CaptureScreenshot())
	dir := *screenshots
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func signIn(t *testing.T, ctx context.Context, e *env) {
	t.Helper()
	run(t, ctx, "sign in", chromedp.Navigate(e.base+"/login?next=/"),
		chromedp.SendKeys(chromedp.CSS(`input[name=token]`), token),
		chromedp.Click(chromedp.CSS(`#signin`)),
		chromedp.WaitVisible(chromedp.CSS(`form[action="/logout"]`)))
}

// TestBrowserPages loads every page with tasks in every state and checks
// what each shows.
func TestBrowserPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, dashboard.Options{Token: token, SampleEvery: time.Second})
	ctx := browser(t)
	signIn(t, ctx, e)
	long := e.ids["long"][0]
	pages := []struct {
		name, path string
		want       []string
	}{
		{"overview", "/", []string{"Throughput", "default", "emails", "images", "chart starts when the dashboard starts"}},
		{"queue-scheduled", "/queues/default?state=scheduled", []string{"cancel-me", "keep", "Run now", "Pause"}},
		{"queue-ready", "/queues/images?state=ready", []string{"img-0.png", "thumbnail"}},
		{"queue-running", "/queues/default?state=running", []string{e.ids["running"][0], "lease"}},
		{"queue-retrying", "/queues/default?state=retrying", []string{"upstream answered 503"}},
		{"task-json", "/tasks/" + url.PathEscape(e.ids["dead"][0]), []string{`"template": "welcome"`, "moved to the dead letters", "Reason", "Retry"}},
		{"task-binary", "/tasks/" + url.PathEscape(e.ids["running"][0]), []string{"hex dump", "62 69 6e 61 72 79 00 01", "started"}},
		{"task-long", "/tasks/" + url.PathEscape(long), []string{long[:40], "0123456789"}},
		{"workers", "/workers", []string{"Workers"}},
		{"dead", "/dead", []string{e.ids["dead"][0], "template \"welcome\" not found"}},
		{"periodic", "/periodic", []string{"nightly report", "0 3 * * * (Europe/Berlin)", "email.send"}},
	}
	// Some traffic for the chart: batches of tasks, each done before the
	// next, until the dashboard has sampled a few intervals with work.
	for i := 0; ; i++ {
		var last string
		for j := range 10 {
			ti, err := e.client.Enqueue(context.Background(), "email.send", []byte(fmt.Sprintf(`{"to":"user%d@example.com"}`, i*10+j)), engine.Queue("emails"))
			if err != nil {
				t.Fatal(err)
			}
			last = ti.ID
		}
		if _, err := e.client.Enqueue(context.Background(), "flaky", []byte(`{"url":"https://example.com/hook"}`), engine.Queue("emails")); err != nil {
			t.Fatal(err)
		}
		e.await(func() bool { return e.state(last) == engine.StateDone }, "a batch done")
		run(t, ctx, "load /", chromedp.Navigate(e.base+"/"), chromedp.WaitReady(chromedp.CSS("svg.chart")))
		if value(t, ctx, "chart points", chromedp.Evaluate[int](`document.querySelectorAll("svg.chart rect.ok").length`)) > 0 {
			break
		}
	}
	// A done task has no listing; the header's box finds it by id.
	done := e.ids["done"][0]
	run(t, ctx, "find by id", chromedp.Navigate(e.base+"/"),
		chromedp.SendKeys(chromedp.CSS(`.find input[name=id]`), done+"\n"),
		chromedp.WaitVisible(chromedp.CSS(`.state.s-done`)))
	if got := text(t, ctx); !strings.Contains(got, done) || !strings.Contains(got, "succeeded") {
		t.Errorf("the done task's page says:\n%s", got)
	}
	for _, p := range pages {
		run(t, ctx, "load "+p.path, chromedp.Navigate(e.base+p.path), chromedp.WaitReady(chromedp.CSS("main")))
		got := text(t, ctx)
		for _, w := range p.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: page does not show %q:\n%s", p.path, w, got)
			}
		}
		// Nothing overflows the laptop-wide viewport (long ids, payloads).
		if value(t, ctx, "measure", chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`)) {
			t.Errorf("%s: the page is wider than the window", p.path)
		}
		shot(t, ctx, p.name)
	}
}

// TestBrowserRetryDead clicks Retry on a dead task's page and sees it run.
func TestBrowserRetryDead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, dashboard.Options{Token: token})
	ctx := browser(t)
	signIn(t, ctx, e)
	id := e.ids["dead"][0]
	e.fixed.Store(true)
	run(t, ctx, "retry", chromedp.Navigate(e.base+"/tasks/"+url.PathEscape(id)),
		chromedp.Click(chromedp.CSS(`button[name=verb][value=retry]`)),
		chromedp.WaitVisible(chromedp.CSS(`.flash.ok`)))
	if got := text(t, ctx); !strings.Contains(got, "retried: 1 task") {
		t.Errorf("after retry the page says:\n%s", got)
	}
	select {
	case got := <-e.ran:
		if got != id {
			t.Fatalf("ran %s, want %s", got, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the retried task did not run")
	}
	e.await(func() bool { return e.state(id) == engine.StateDone }, "the retried task done")
	run(t, ctx, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`.state.s-done`)))
}

// TestBrowserBulkCancelFiltered searches the scheduled tasks, chooses
// "every task matching", confirms, and only the matches are cancelled.
func TestBrowserBulkCancelFiltered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, dashboard.Options{Token: token})
	ctx := browser(t)
	signIn(t, ctx, e)
	run(t, ctx, "search", chromedp.Navigate(e.base+"/queues/default?state=scheduled&q=cancel-me"),
		chromedp.WaitReady(chromedp.CSS(`#scope-all`)),
		chromedp.Click(chromedp.CSS(`#scope-all`)),
		chromedp.Click(chromedp.CSS(`button[name=verb][value=cancel]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm`)))
	confirmText := text(t, ctx)
	if !strings.Contains(confirmText, "cancel-me") || !strings.Contains(confirmText, "cannot be undone") {
		t.Errorf("confirmation page says:\n%s", confirmText)
	}
	shot(t, ctx, "confirm")
	// Nothing changed before the confirmation.
	for _, id := range e.ids["cancel-me"] {
		if s := e.state(id); s != engine.StateScheduled {
			t.Fatalf("task %s is %s before the confirmation", id, s)
		}
	}
	run(t, ctx, "confirm", chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`.flash.ok`)))
	if got := text(t, ctx); !strings.Contains(got, fmt.Sprintf("cancelled: %d tasks", len(e.ids["cancel-me"]))) {
		t.Errorf("after the bulk cancel the page says:\n%s", got)
	}
	for _, id := range e.ids["cancel-me"] {
		if s := e.state(id); s != engine.StateCancelled {
			t.Errorf("task %s (matching) is %s, want cancelled", id, s)
		}
	}
	for _, id := range e.ids["keep"] {
		if s := e.state(id); s != engine.StateScheduled {
			t.Errorf("task %s (not matching) is %s, want scheduled", id, s)
		}
	}

	// A selection: the buttons are disabled until a box is ticked.
	victim := e.ids["keep"][0]
	run(t, ctx, "load", chromedp.Navigate(e.base+"/queues/default?state=scheduled&q=keep"),
		chromedp.WaitReady(chromedp.CSS(`button[name=verb][value=delete]`)))
	if !value(t, ctx, "disabled", chromedp.Evaluate[bool](`document.querySelector('button[name=verb][value=delete]').disabled`)) {
		t.Error("Delete is enabled with nothing selected")
	}
	run(t, ctx, "select and delete",
		chromedp.Click(chromedp.CSS(`input[name=id][value="`+victim+`"]`)),
		chromedp.WaitEnabled(chromedp.CSS(`button[name=verb][value=delete]`)),
		chromedp.Click(chromedp.CSS(`button[name=verb][value=delete]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.Click(chromedp.CSS(`#confirm`)),
		chromedp.WaitVisible(chromedp.CSS(`.flash.ok`)))
	if got := text(t, ctx); !strings.Contains(got, "deleted: 1 task") {
		t.Errorf("after deleting the selection the page says:\n%s", got)
	}
	if _, err := e.client.Lookup(context.Background(), victim); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("the deleted task: lookup error %v, want ErrNotFound", err)
	}
	for _, id := range e.ids["keep"][1:] {
		if s := e.state(id); s != engine.StateScheduled {
			t.Errorf("task %s (not selected) is %s, want scheduled", id, s)
		}
	}
}

// post sends a form to /actions with the given headers and cookies and
// returns the status.
func post(t *testing.T, base string, form url.Values, hdr map[string]string, cookies ...*http.Cookie) int {
	t.Helper()
	code, _ := postBody(t, base, form, hdr, cookies...)
	return code
}

func postBody(t *testing.T, base string, form url.Values, hdr map[string]string, cookies ...*http.Cookie) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/actions", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestActionsNeedToken: a change without the token, with a wrong one, or
// from another origin is refused with 403 and changes nothing; with the
// bearer token it is done.
func TestActionsNeedToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, dashboard.Options{Token: token})
	id := e.ids["dead"][0]
	form := url.Values{"verb": {"retry"}, "id": {id}, "state": {"dead"}, "queue": {"emails"}}
	csrf := &http.Cookie{Name: "bq_csrf", Value: strings.Repeat("a", 48)}
	withCSRF := url.Values{"csrf": {csrf.Value}}
	for k, v := range form {
		withCSRF[k] = v
	}
	for name, code := range map[string]int{
		"no token":            post(t, e.base, form, nil),
		"wrong bearer":        post(t, e.base, form, map[string]string{"Authorization": "Bearer nope"}),
		"csrf but no session": post(t, e.base, withCSRF, nil, csrf),
		"forged session":      post(t, e.base, withCSRF, nil, csrf, &http.Cookie{Name: "bq_session", Value: "forged"}),
	} {
		if code != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", name, code)
		}
	}
	if s := e.state(id); s != engine.StateDead {
		t.Fatalf("a refused request changed the task: %s", s)
	}
	// A signed-in session from another site is refused too.
	jar := signInHTTP(t, e.base)
	if code := post(t, e.base, withCSRFOf(form, jar), map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}, jar...); code != http.StatusForbidden {
		t.Errorf("cross-site with a session: status %d, want 403", code)
	}
	bearer := map[string]string{"Authorization": "Bearer " + token}
	del := url.Values{"verb": {"delete"}, "id": {e.ids["keep"][0]}}
	if code, body := postBody(t, e.base, del, bearer); code != http.StatusBadRequest || !strings.Contains(body, "confirm=yes") {
		t.Errorf("a script's delete without confirm=yes: %d %q, want 400 asking for it", code, body)
	}
	if s := e.state(e.ids["keep"][0]); s != engine.StateScheduled {
		t.Errorf("an unconfirmed delete changed the task: %s", s)
	}
	e.fixed.Store(true)
	if code, body := postBody(t, e.base, form, bearer); code != http.StatusOK || !strings.Contains(body, `"done":1`) {
		t.Errorf("with the bearer token: %d %q, want 200 and one done", code, body)
	}
	e.await(func() bool { return e.state(id) == engine.StateDone }, "the task retried with the token done")
}

// signInHTTP signs in without a browser and returns the cookies.
func signInHTTP(t *testing.T, base string) []*http.Cookie {
	t.Helper()
	resp, err := http.Get(base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var csrf *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "bq_csrf" {
			csrf = c
		}
	}
	if csrf == nil {
		t.Fatal("no CSRF cookie from /login")
	}
	req, _ := http.NewRequest("POST", base+"/login", strings.NewReader(url.Values{"csrf": {csrf.Value}, "token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(csrf)
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	out := []*http.Cookie{csrf}
	for _, c := range resp.Cookies() {
		if c.Name == "bq_session" {
			out = append(out, c)
		}
	}
	if len(out) != 2 {
		t.Fatalf("sign-in: status %d, no session cookie", resp.StatusCode)
	}
	return out
}

func withCSRFOf(form url.Values, cookies []*http.Cookie) url.Values {
	out := url.Values{"csrf": {cookies[0].Value}}
	for k, v := range form {
		out[k] = v
	}
	return out
}

// TestBrowserReadOnly: no action is offered, and even the token cannot
// change anything.
func TestBrowserReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, dashboard.Options{Token: token, ReadOnly: true})
	ctx := browser(t)
	for _, p := range []string{"/", "/queues/default?state=scheduled", "/dead", "/tasks/" + url.PathEscape(e.ids["dead"][0])} {
		run(t, ctx, "load "+p, chromedp.Navigate(e.base+p), chromedp.WaitReady(chromedp.CSS("main")))
		n := value(t, ctx, "count controls", chromedp.Evaluate[int](`document.querySelectorAll('form[action="/actions"] button, form[action="/actions"] input[name=id]').length`))
		if n != 0 {
			t.Errorf("%s: %d action controls in read-only mode", p, n)
		}
		if got := text(t, ctx); p == "/" && !strings.Contains(got, "Throughput") {
			t.Errorf("%s: page did not load:\n%s", p, got)
		}
	}
	badge := value(t, ctx, "badge", chromedp.Text(chromedp.CSS(".badge.ro")))
	if !strings.Contains(badge, "read-only") {
		t.Errorf("badge = %q", badge)
	}
	form := url.Values{"verb": {"retry"}, "id": {e.ids["dead"][0]}}
	if code := post(t, e.base, form, map[string]string{"Authorization": "Bearer " + token}); code != http.StatusForbidden {
		t.Errorf("read-only with the token: status %d, want 403", code)
	}
}

// TestWrongTokensLimited: after a burst of wrong tokens from one address
// even the right one is refused from there (429) for a while, so a token
// cannot be guessed quickly. Other addresses are not refused: see
// TestWrongTokensLockOutOneClient.
func TestWrongTokensLimited(t *testing.T) {
	t.Parallel()
	e := newEnv(t, dashboard.Options{Token: token})
	form := url.Values{"verb": {"retry"}, "id": {e.ids["dead"][0]}}
	for i := range 20 {
		if code := post(t, e.base, form, map[string]string{"Authorization": fmt.Sprintf("Bearer guess-%d", i)}); code != http.StatusForbidden {
			t.Fatalf("wrong token %d: status %d, want 403", i, code)
		}
	}
	if code := post(t, e.base, form, map[string]string{"Authorization": "Bearer " + token}); code != http.StatusTooManyRequests {
		t.Errorf("the right token after a burst of wrong ones: status %d, want 429", code)
	}
	if s := e.state(e.ids["dead"][0]); s != engine.StateDead {
		t.Errorf("the task changed: %s", s)
	}
}

// TestBrowserPauseResume pauses a queue with its button, sees it marked
// paused with a task waiting in it, and resumes it: the task runs.
func TestBrowserPauseResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, dashboard.Options{Token: token})
	ctx := browser(t)
	signIn(t, ctx, e)
	run(t, ctx, "pause", chromedp.Navigate(e.base+"/queues/emails"),
		chromedp.Click(chromedp.CSS(`#pause-toggle`)),
		chromedp.WaitVisible(chromedp.CSS(`.flash.ok`)))
	if got := text(t, ctx); !strings.Contains(got, "queue emails paused") || !strings.Contains(got, "Resume") {
		t.Fatalf("after pause the page says:\n%s", got)
	}
	// Without the token (no session, no bearer) pausing is refused.
	resp, err := http.PostForm(e.base+"/queues/default/pause", url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("pause without the token: %d, want 403", resp.StatusCode)
	}
	bg := context.Background()
	qs, err := e.in.Queues(bg)
	if err != nil {
		t.Fatal(err)
	}
	var paused []string
	for _, q := range qs {
		if q.Paused {
			paused = append(paused, q.Queue)
		}
	}
	if len(paused) != 1 || paused[0] != "emails" {
		t.Fatalf("paused queues %v; want [emails]", paused)
	}
	info, err := e.client.Enqueue(bg, "email.send", nil, engine.Queue("emails"))
	if err != nil {
		t.Fatal(err)
	}
	if s := e.state(info.ID); s != engine.StateReady {
		t.Fatalf("a task of the paused queue is %s, want ready", s)
	}
	run(t, ctx, "resume", chromedp.Click(chromedp.CSS(`#pause-toggle`)),
		chromedp.WaitNotPresent(chromedp.CSS(`.actions .badge`)),
		chromedp.WaitVisible(chromedp.CSS(`.flash.ok`)))
	if got := text(t, ctx); !strings.Contains(got, "queue emails resumed") {
		t.Fatalf("after resume the page says:\n%s", got)
	}
	e.await(func() bool { return e.state(info.ID) == engine.StateDone }, "the task of the resumed queue done")
}
