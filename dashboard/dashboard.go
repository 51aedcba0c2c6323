// Package dashboard is bucketq's web dashboard: server-rendered pages
// (html/template) over a [Backend], with every asset embedded, so a
// binary that mounts it needs nothing else installed and the browser
// makes no request to another site.
//
// Pages: the overview (queues, sizes, latency, a chart of processed and
// failed tasks per minute sampled by this process), a queue's tasks by
// state with paging, search, selection and bulk actions, one task, the
// workers, the dead letters, and the periodic entries.
//
// Changing anything needs the token the process was given: a browser
// signs in with it once (a session cookie) and every form carries a CSRF
// value checked against a cookie, together with the Origin and
// Sec-Fetch-Site headers; a script sends "Authorization: Bearer TOKEN".
// Without a token, or in read-only mode, no action is offered and every
// state-changing request is refused with 403. With a read token, seeing
// anything needs one of the two tokens too; the read token allows no
// change. A script's errors are JSON: {"error": "..."}.
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/internal/safetext"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Defaults of Options.
const (
	DefaultSampleEvery = 5 * time.Second
	DefaultPageSize    = 25
	chartWindow        = time.Hour
	requestTimeout     = 10 * time.Second

	// maxScans bounds the listings and searches in flight: one more is
	// answered 503 at once rather than queued.
	maxScans = 4
	// scanBudget bounds the bytes of task records one listing or search
	// reads; the page then says where it stopped and Next goes on.
	scanBudget = 8 << 20
	// Bounds of a request body: forms are small, a script's action may
	// name many tasks.
	maxFormBody   = 64 << 10
	maxActionBody = 1 << 20
)

// Options configures [New].
type Options struct {
	// Token is what signs a browser in and what a script sends as a
	// bearer token. Empty: nothing can be changed.
	Token string
	// ReadToken, when set, is needed (or Token) to see anything: pages,
	// listings, and what Guard serves. It allows no change.
	ReadToken string
	// ReadOnly offers no action and refuses every change, token or not.
	ReadOnly bool
	// SecureCookies marks every cookie Secure. Without it a cookie is
	// Secure when the request came over TLS or through a proxy that sent
	// X-Forwarded-Proto: https.
	SecureCookies bool
	// SampleEvery is how often Run samples the processed and failed
	// totals for the chart; 0 is DefaultSampleEvery.
	SampleEvery time.Duration
	// PageSize is the number of tasks on a page; 0 is DefaultPageSize.
	PageSize int
	// Logger receives errors; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Dashboard is the dashboard's http.Handler. Run samples the chart's
// figures; without it the chart stays empty.
type Dashboard struct {
	b     Backend
	opts  Options
	mux   *http.ServeMux
	tmpl  map[string]*template.Template
	hist  *history
	sess  sessions
	guess guesses
	start time.Time
	scans chan struct{} // a slot per listing or search in flight
	// budget is what ListOptions.MaxBytes is given (scanBudget; tests
	// lower it).
	budget int64
}

// New returns the dashboard over b.
func New(b Backend, opts Options) (*Dashboard, error) {
	if b == nil {
		return nil, errors.New("dashboard: nil backend")
	}
	if opts.SampleEvery <= 0 {
		opts.SampleEvery = DefaultSampleEvery
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	d := &Dashboard{b: b, opts: opts, mux: http.NewServeMux(), tmpl: map[string]*template.Template{},
		hist: newHistory(int(chartWindow/opts.SampleEvery) + 1), start: opts.Now(),
		scans: make(chan struct{}, maxScans), budget: scanBudget}
	for _, page := range []string{"overview", "queue", "task", "workflow", "workers", "periodic", "confirm", "login", "error"} {
		t, err := template.New("layout.html").Funcs(d.funcs()).ParseFS(templateFS, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: template %s: %w", page, err)
		}
		d.tmpl[page] = t
	}
	static, _ := fs.Sub(staticFS, "static")
	d.mux.Handle("GET /static/", http.StripPrefix("/static/", cacheForever(http.FileServerFS(static))))
	d.mux.HandleFunc("GET /{$}", d.overview)
	d.mux.HandleFunc("GET /queues/{queue}", d.queue)
	d.mux.HandleFunc("GET /tasks/{id}", d.task)
	d.mux.HandleFunc("GET /workflows/{id}", d.workflow)
	d.mux.HandleFunc("GET /tasks", func(w http.ResponseWriter, r *http.Request) {
		// The header's "Task id" box: any task, done and cancelled ones too.
		id := strings.TrimSpace(r.URL.Query().Get("id"))
		if id == "" {
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
		http.Redirect(w, r, "/tasks/"+url.PathEscape(id), http.StatusSeeOther)
	})
	d.mux.HandleFunc("GET /workers", d.workers)
	d.mux.HandleFunc("GET /dead", d.dead)
	d.mux.HandleFunc("GET /periodic", d.periodic)
	d.mux.HandleFunc("GET /login", d.loginPage)
	d.mux.HandleFunc("POST /login", d.login)
	d.mux.HandleFunc("POST /logout", d.logout)
	d.mux.HandleFunc("POST /actions", d.act)
	d.mux.HandleFunc("POST /queues/{queue}/pause", d.pauseResume(true))
	d.mux.HandleFunc("POST /queues/{queue}/resume", d.pauseResume(false))
	d.mux.HandleFunc("POST /queues/{queue}/limits", d.setLimits)
	return d, nil
}

// ServeHTTP serves the dashboard with its security headers: a content
// security policy that allows this origin only, no framing.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Content-Type-Options", "nosniff")
	if !strings.HasPrefix(r.URL.Path, "/static/") {
		h.Set("Cache-Control", "no-store")
	}
	if r.Method == http.MethodPost {
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); strings.HasPrefix(mt, "multipart/") {
			d.fail(w, r, http.StatusUnsupportedMediaType, errors.New("a multipart body is not accepted: send application/x-www-form-urlencoded"))
			return
		}
		limit := int64(maxFormBody)
		if r.URL.Path == "/actions" {
			limit = maxActionBody
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
	}
	switch {
	case r.URL.Path == "/login", r.URL.Path == "/logout", strings.HasPrefix(r.URL.Path, "/static/"):
	default:
		if !d.readGate(w, r) {
			return
		}
	}
	d.mux.ServeHTTP(w, r)
}

// readGate lets through the requests that may read the dashboard (see
// mayRead) and answers the others: a browser's page view goes to the
// sign-in page, anything else gets 401.
func (d *Dashboard) readGate(w http.ResponseWriter, r *http.Request) bool {
	ok, err := d.mayRead(r)
	switch {
	case err != nil:
		d.tooMany(w, r, err)
	case ok:
		return true
	case r.Method == http.MethodGet && !wantsJSON(r):
		http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
	default:
		w.Header().Set("WWW-Authenticate", `Bearer realm="bucketq"`)
		d.fail(w, r, http.StatusUnauthorized, errors.New("refused: send the read token or the token (Authorization: Bearer TOKEN), or sign in"))
	}
	return false
}

// Guard serves h to the requests that may read the dashboard: all of
// them without a read token, else those with either token as their
// bearer token or a signed-in session; the others get 401. It is how a
// process puts /metrics behind the read token.
func (d *Dashboard) Guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, err := d.mayRead(r)
		switch {
		case err != nil:
			w.Header().Set("Retry-After", strconv.Itoa(int(guessWindow/time.Second)))
			replyJSON(w, http.StatusTooManyRequests, map[string]string{"error": err.Error()})
		case !ok:
			w.Header().Set("WWW-Authenticate", `Bearer realm="bucketq"`)
			replyJSON(w, http.StatusUnauthorized, map[string]string{"error": "refused: send the read token or the token (Authorization: Bearer TOKEN)"})
		default:
			h.ServeHTTP(w, r)
		}
	})
}

func cacheForever(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		h.ServeHTTP(w, r)
	})
}

// Run samples the processed and failed totals every SampleEvery until
// ctx ends. It returns ctx's error.
func (d *Dashboard) Run(ctx context.Context) error {
	t := time.NewTicker(d.opts.SampleEvery)
	defer t.Stop()
	for {
		d.sample(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (d *Dashboard) sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.SampleEvery)
	defer cancel()
	qs, err := d.b.Queues(ctx)
	if err != nil && len(qs) == 0 {
		d.opts.Logger.Warn("dashboard: sampling queue totals", "err", err)
		return
	}
	s := sample{at: d.opts.Now()}
	for _, q := range qs {
		s.processed += q.Processed
		s.failed += q.Failed
	}
	d.hist.add(s)
}

// canAct says whether actions are offered at all.
func (d *Dashboard) canAct() bool { return d.opts.Token != "" && !d.opts.ReadOnly }

// canSignIn says whether there is a token to sign in with.
func (d *Dashboard) canSignIn() bool { return d.canAct() || d.opts.ReadToken != "" }

// base is what every page's layout shows.
type base struct {
	Title, Nav   string
	CSRF         string
	CanAct       bool // a token is configured, not read-only, and the session is not a reader's
	SignedIn     bool
	Reader       bool // signed in with the read token
	ReadOnly     bool
	Flash, Error string
	Path         string
}

func (d *Dashboard) base(w http.ResponseWriter, r *http.Request, title, nav string) base {
	ok, bad := d.takeFlash(w, r)
	acc := d.session(r)
	return base{Title: title, Nav: nav, CSRF: d.csrfToken(w, r), CanAct: d.canAct() && acc != readAccess,
		SignedIn: acc != noAccess, Reader: acc == readAccess, ReadOnly: d.opts.ReadOnly,
		Flash: ok, Error: bad, Path: r.URL.RequestURI()}
}

func (d *Dashboard) render(w http.ResponseWriter, page string, code int, data any) {
	var b strings.Builder
	if err := d.tmpl[page].Execute(&b, data); err != nil {
		d.opts.Logger.Error("dashboard: render", "page", page, "err", err)
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(b.String()))
}

// fail answers r with code and err: a JSON {"error": ...} to a script
// (see wantsJSON), else the error page.
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, code int, err error) {
	d.opts.Logger.Warn("dashboard", "path", r.URL.Path, "code", code, "err", err)
	if wantsJSON(r) {
		replyJSON(w, code, map[string]string{"error": err.Error()})
		return
	}
	d.render(w, "error", code, struct {
		base
		Code int
		Msg  string
	}{d.base(w, r, "Error", ""), code, err.Error()})
}

func ctxOf(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), requestTimeout)
}

// errBusy refuses a listing while maxScans others run.
var errBusy = fmt.Errorf("busy: %d listings or searches are running; try again in a moment", maxScans)

// scan takes a slot for a listing or search, or answers 503 and returns
// false when every slot is taken. Call the returned release when done.
func (d *Dashboard) scan(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	select {
	case d.scans <- struct{}{}:
		return func() { <-d.scans }, true
	default:
		w.Header().Set("Retry-After", "1")
		d.fail(w, r, http.StatusServiceUnavailable, errBusy)
		return nil, false
	}
}

// parseForm parses r's form: a body over its bound is 413.
func (d *Dashboard) parseForm(w http.ResponseWriter, r *http.Request) bool {
	err := r.ParseForm()
	if err == nil {
		return true
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		d.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("request body over %d bytes", tooBig.Limit))
		return false
	}
	d.fail(w, r, http.StatusBadRequest, err)
	return false
}

// mib is n bytes in MiB, rounded up.
func mib(n int64) int64 { return (n + 1<<20 - 1) >> 20 }

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	qs, err := d.b.Queues(ctx)
	ss, _ := d.hist.samples()
	now := d.opts.Now()
	var errMsg string
	if err != nil {
		errMsg = err.Error()
	}
	mem, merr := d.b.MemoryPolicy(ctx)
	if merr != nil {
		mem.Unknown = merr.Error()
	}
	var tot engine.QueueInfo
	for _, q := range qs {
		tot.Ready += q.Ready
		tot.Scheduled += q.Scheduled
		tot.Running += q.Running
		tot.Retrying += q.Retrying
		tot.Dead += q.Dead
		tot.Processed += q.Processed
		tot.Failed += q.Failed
	}
	d.render(w, "overview", http.StatusOK, struct {
		base
		Queues  []engine.QueueInfo
		Total   engine.QueueInfo
		Chart   chart
		Started time.Time
		Every   time.Duration
		ReadErr string
		Memory  engine.MemoryPolicy
	}{d.base(w, r, "Overview", "overview"), qs, tot, drawChart(ss, chartWindow, now), d.start, d.opts.SampleEvery, errMsg, mem})
}

// states are the tabs of a queue page, in a task's usual order.
var states = []engine.State{engine.StateScheduled, engine.StateReady, engine.StateRunning,
	engine.StateRetrying, engine.StateDead, engine.StateDone}

type tab struct {
	State engine.State
	Count int64
	Known bool
}

func (d *Dashboard) queue(w http.ResponseWriter, r *http.Request) {
	state := engine.State(r.URL.Query().Get("state"))
	if state == "" {
		state = engine.StateReady
	}
	d.listing(w, r, r.PathValue("queue"), state)
}

// dead lists the dead letters of every queue.
func (d *Dashboard) dead(w http.ResponseWriter, r *http.Request) {
	d.listing(w, r, "", engine.StateDead)
}

// listing is a page of tasks of queue (every queue when "") in state.
func (d *Dashboard) listing(w http.ResponseWriter, r *http.Request, name string, state engine.State) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	qv := r.URL.Query()
	if !validState(state) {
		d.fail(w, r, http.StatusBadRequest, fmt.Errorf("unknown state %q", state))
		return
	}
	page, _ := strconv.Atoi(qv.Get("page"))
	page = max(page, 1)
	search := strings.TrimSpace(qv.Get("q"))
	release, ok := d.scan(w, r)
	if !ok {
		return
	}
	defer release()
	qs, qerr := d.b.Queues(ctx)
	var stats engine.QueueInfo
	found := false
	for _, q := range qs {
		if q.Queue == name {
			stats, found = q, true
		}
	}
	if name != "" && !found && qerr == nil {
		d.fail(w, r, http.StatusNotFound, fmt.Errorf("no queue %q: nothing was ever enqueued to it", name))
		return
	}
	counts := map[engine.State]int64{engine.StateScheduled: stats.Scheduled, engine.StateReady: stats.Ready,
		engine.StateRunning: stats.Running, engine.StateRetrying: stats.Retrying, engine.StateDead: stats.Dead}
	var tabs []tab
	for _, s := range states {
		if s == engine.StateDone {
			continue // found by id only
		}
		c, ok := counts[s]
		tabs = append(tabs, tab{s, c, ok})
	}
	res, err := d.b.ListTasks(ctx, engine.ListOptions{Filter: engine.Filter{Queue: name, State: state, Search: search},
		Cursor: qv.Get("cursor"), Limit: d.opts.PageSize, MaxBytes: d.budget})
	var errMsg, stopped string
	if err != nil {
		res = &engine.TaskPage{}
		errMsg = err.Error()
	}
	if res.Next != "" && res.BytesRead >= d.budget {
		what := "Listing"
		if search != "" {
			what = "Search"
		}
		stopped = fmt.Sprintf("%s stopped after %d MiB of task records read: Next goes on from there.", what, mib(res.BytesRead))
	}
	action := "/dead"
	if name != "" {
		action = "/queues/" + url.PathEscape(name)
	}
	link := func(p int, cursor string) string {
		v := url.Values{"state": {string(state)}}
		if name == "" {
			v = url.Values{}
		}
		if p > 1 {
			v.Set("page", strconv.Itoa(p))
			v.Set("cursor", cursor)
		}
		if search != "" {
			v.Set("q", search)
		}
		if len(v) == 0 {
			return action
		}
		return action + "?" + v.Encode()
	}
	var first, next string
	if page > 1 {
		first = link(1, "")
	}
	if res.Next != "" {
		next = link(page+1, res.Next)
	}
	title, nav := "Queue "+name, "overview"
	if name == "" {
		title, nav = "Dead letters", "dead"
	}
	d.render(w, "queue", http.StatusOK, struct {
		base
		Queue       string
		Action      string
		Tabs        []tab
		State       engine.State
		Search      string
		Tasks       []*engine.TaskInfo
		Total       int64
		Page        int
		First, Next string
		Verbs       []engine.Action
		ReadErr     string
		Stopped     string
		Paused      bool
		Limits      engine.QueueInfo
	}{d.base(w, r, title, nav), name, action, tabs, state, search, res.Tasks, res.Total,
		page, first, next, verbsFor(state), errMsg, stopped, stats.Paused, stats})
}

func validState(s engine.State) bool {
	for _, v := range states {
		if v == s {
			return true
		}
	}
	return s == engine.StateCancelled
}

func (d *Dashboard) task(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	ti, err := d.b.Task(ctx, r.PathValue("id"))
	if err != nil {
		d.fail(w, r, byIDStatus(err), err)
		return
	}
	pretty, kind := prettyPayload(ti.Payload)
	var result, resultKind, resultErr string
	hasResult := false
	if ti.Result != nil {
		hasResult = true
		result, resultKind = prettyPayload(ti.Result)
	}
	d.render(w, "task", http.StatusOK, struct {
		base
		T          *engine.TaskInfo
		Payload    string
		Kind       string
		Timeline   []event
		Verbs      []engine.Action
		HasResult  bool
		Result     string
		ResultKind string
		ResultErr  string
	}{d.base(w, r, "Task "+ti.ID, ""), ti, pretty, kind, timeline(ti), verbsFor(ti.State), hasResult, result, resultKind, resultErr})
}

// byIDStatus is the HTTP status of a failed read of a task or workflow by
// id: 404 for an id that names nothing (or cannot name anything), else 500.
func byIDStatus(err error) int {
	if errors.Is(err, engine.ErrNotFound) || errors.Is(err, engine.ErrInvalid) {
		return http.StatusNotFound
	}
	return http.StatusInternalServerError
}

// workflow shows a chain's steps or a group's members, their states and
// where the workflow stopped.
func (d *Dashboard) workflow(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	wf, err := d.b.Workflow(ctx, r.PathValue("id"))
	if err != nil {
		d.fail(w, r, byIDStatus(err), err)
		return
	}
	d.render(w, "workflow", http.StatusOK, struct {
		base
		W *engine.WorkflowInfo
	}{d.base(w, r, "Workflow "+wf.ID, ""), wf})
}

func (d *Dashboard) workers(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	ws, err := d.b.Workers(ctx)
	var errMsg string
	if err != nil {
		errMsg = err.Error()
	}
	d.render(w, "workers", http.StatusOK, struct {
		base
		Workers []engine.WorkerInfo
		Now     time.Time
		ReadErr string
	}{d.base(w, r, "Workers", "workers"), ws, d.opts.Now(), errMsg})
}

func (d *Dashboard) periodic(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	ps, err := d.b.Periodics(ctx)
	var errMsg string
	if err != nil {
		errMsg = err.Error()
	}
	d.render(w, "periodic", http.StatusOK, struct {
		base
		Entries []engine.PeriodicStatus
		ReadErr string
	}{d.base(w, r, "Periodic entries", "periodic"), ps, errMsg})
}

// pauseResume pauses (or resumes) the queue of the path: workers stop
// taking its tasks within a second and start again at once on resume.
func (d *Dashboard) pauseResume(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !d.parseForm(w, r) {
			return
		}
		q := r.PathValue("queue")
		if !d.allowed(w, r, "pause/resume", "queue", q) {
			return
		}
		ctx, cancel := ctxOf(r)
		defer cancel()
		op, done := d.b.ResumeQueue, "resumed"
		if pause {
			op, done = d.b.PauseQueue, "paused: no task of it starts until it is resumed"
		}
		if err := op(ctx, q); err != nil {
			d.fail(w, r, http.StatusBadRequest, err)
			return
		}
		if _, script := bearer(r); script {
			replyJSON(w, http.StatusOK, map[string]any{"queue": q, "paused": pause})
			return
		}
		d.redirectFlash(w, r, "/queues/"+url.PathEscape(q), "ok", "queue "+q+" "+done)
	}
}

// setLimits sets the flow control of the queue of the path from the
// form's max_running, rate, key_max_running and key_rate, all at once (a
// field left empty removes that limit): workers apply it within a second.
func (d *Dashboard) setLimits(w http.ResponseWriter, r *http.Request) {
	if !d.parseForm(w, r) {
		return
	}
	q := r.PathValue("queue")
	if !d.allowed(w, r, "set limits", "queue", q) {
		return
	}
	num := func(field string) (int, error) {
		v := strings.TrimSpace(r.PostForm.Get(field))
		if v == "" {
			return 0, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s %s: want 0 (no limit) or more", field, safetext.Quote(v))
		}
		return n, nil
	}
	qc := engine.QueueConfig{Name: q, Rate: strings.TrimSpace(r.PostForm.Get("rate")), KeyRate: strings.TrimSpace(r.PostForm.Get("key_rate"))}
	var err error
	if qc.MaxRunning, err = num("max_running"); err == nil {
		qc.KeyMaxRunning, err = num("key_max_running")
	}
	ctx, cancel := ctxOf(r)
	defer cancel()
	if err == nil {
		err = d.b.SetQueueLimits(ctx, qc)
	}
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if _, script := bearer(r); script {
		replyJSON(w, http.StatusOK, map[string]any{"queue": q, "max_running": qc.MaxRunning, "rate": qc.Rate,
			"key_max_running": qc.KeyMaxRunning, "key_rate": qc.KeyRate})
		return
	}
	d.redirectFlash(w, r, "/queues/"+url.PathEscape(q), "ok", "queue "+q+": limits set; workers apply them within a second")
}

// tooMany answers a client refused for its wrong tokens.
func (d *Dashboard) tooMany(w http.ResponseWriter, r *http.Request, err error) {
	w.Header().Set("Retry-After", strconv.Itoa(int(guessWindow/time.Second)))
	d.fail(w, r, http.StatusTooManyRequests, err)
}

// allowed says whether r may change state (see authorized), and
// answers it when not: 429 for a client refused for its wrong tokens,
// else 403.
func (d *Dashboard) allowed(w http.ResponseWriter, r *http.Request, what string, args ...any) bool {
	ok, err := d.authorized(r)
	if ok {
		return true
	}
	d.opts.Logger.Warn("dashboard: refused "+what, append([]any{"remote", r.RemoteAddr}, args...)...)
	if err != nil {
		d.tooMany(w, r, err)
		return false
	}
	msg := "refused: sign in with the token first (or send Authorization: Bearer TOKEN)"
	switch {
	case !d.canAct():
		msg = "refused: this dashboard is read-only"
	case d.session(r) == readAccess:
		msg = "refused: signed in with the read token, which allows no change"
	}
	d.fail(w, r, http.StatusForbidden, errors.New(msg))
	return false
}

func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	d.render(w, "login", http.StatusOK, struct {
		base
		Next      string
		CanSignIn bool
	}{d.base(w, r, "Sign in", ""), safeReturn(r.URL.Query().Get("next")), d.canSignIn()})
}

func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	if !d.parseForm(w, r) {
		return
	}
	if !d.canSignIn() {
		d.fail(w, r, http.StatusForbidden, errors.New("this dashboard is read-only"))
		return
	}
	if !d.csrfOK(r) {
		d.opts.Logger.Warn("dashboard: refused sign-in: the form did not come from this page", "remote", r.RemoteAddr)
		d.fail(w, r, http.StatusForbidden, errors.New("wrong token, or the form did not come from this page"))
		return
	}
	acc, err := d.checkToken(r, r.PostFormValue("token"))
	if err != nil {
		d.tooMany(w, r, err)
		return
	}
	if acc == noAccess {
		d.opts.Logger.Warn("dashboard: refused sign-in: wrong token", "remote", r.RemoteAddr)
		d.fail(w, r, http.StatusForbidden, errors.New("wrong token, or the form did not come from this page"))
		return
	}
	d.setCookie(w, r, &http.Cookie{Name: sessionCookie, Value: d.sess.create(d.opts.Now(), acc), MaxAge: int(sessionTTL / time.Second)})
	http.Redirect(w, r, safeReturn(r.PostFormValue("next")), http.StatusSeeOther)
}

func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	if !d.parseForm(w, r) {
		return
	}
	if c, err := r.Cookie(sessionCookie); err == nil && d.csrfOK(r) {
		d.sess.drop(c.Value)
	}
	d.setCookie(w, r, &http.Cookie{Name: sessionCookie, Value: "", MaxAge: -1})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// safeReturn is a path of this origin to go back to: "/" for anything
// else. A browser drops tabs and newlines from a URL and reads a
// backslash as "/", so "/<tab>/host" or "/\host" would name another host:
// any control character is refused, and so is a path that starts with
// "//" or "/\", as it is or once unescaped.
func safeReturn(p string) string {
	if !strings.HasPrefix(p, "/") {
		return "/"
	}
	for _, c := range p {
		if c < 0x20 || (c >= 0x7f && c <= 0x9f) {
			return "/"
		}
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "/"
	}
	for _, s := range []string{p, u.Path} {
		if strings.HasPrefix(s, "//") || strings.HasPrefix(s, "/\\") {
			return "/"
		}
	}
	return p
}

// act applies a verb to one task, a selection or a filter. Destructive
// verbs, and any verb on a whole filter, show a confirmation page first.
func (d *Dashboard) act(w http.ResponseWriter, r *http.Request) {
	if !d.parseForm(w, r) {
		return
	}
	if !d.allowed(w, r, "action", "verb", r.PostFormValue("verb")) {
		return
	}
	a := action{Verb: engine.Action(r.PostFormValue("verb")), IDs: r.PostForm["id"], All: r.PostFormValue("scope") == "all",
		Filter: engine.Filter{Queue: r.PostFormValue("queue"), State: engine.State(r.PostFormValue("state")), Search: r.PostFormValue("q")}}
	back := safeReturn(r.PostFormValue("return"))
	// A script (bearer token) gets JSON and no confirmation page: it
	// confirms with confirm=yes.
	_, script := bearer(r)
	if _, ok := verbPast[a.Verb]; !ok {
		d.fail(w, r, http.StatusBadRequest, fmt.Errorf("unknown action %q", a.Verb))
		return
	}
	if a.All {
		a.IDs = nil
		if !validState(a.Filter.State) {
			d.fail(w, r, http.StatusBadRequest, errors.New("an action on a filter needs a state"))
			return
		}
	} else if len(a.IDs) == 0 {
		if script {
			replyJSON(w, http.StatusBadRequest, map[string]string{"error": "no task: give id=ID (repeatable) or scope=all with state (and queue, q)"})
			return
		}
		d.redirectFlash(w, r, back, "err", "select at least one task")
		return
	}
	ctx, cancel := ctxOf(r)
	defer cancel()
	if a.All {
		release, ok := d.scan(w, r)
		if !ok {
			return
		}
		defer release()
	}
	if (destructive(a.Verb) || a.All) && r.PostFormValue("confirm") != "yes" {
		if script {
			replyJSON(w, http.StatusBadRequest, map[string]string{"error": "cancel, delete and actions on every task of a filter need confirm=yes"})
			return
		}
		matching, exact := int64(len(a.IDs)), true
		if a.All {
			p, err := d.b.ListTasks(ctx, engine.ListOptions{Filter: engine.Filter{Queue: a.Filter.Queue, State: a.Filter.State}, Limit: 1, MaxBytes: 1})
			if err != nil {
				d.fail(w, r, http.StatusBadRequest, err)
				return
			}
			// With a search, the state's count bounds the matches.
			matching, exact = p.Total, a.Filter.Search == ""
		}
		d.render(w, "confirm", http.StatusOK, struct {
			base
			A        action
			Matching int64
			Exact    bool
			Return   string
		}{d.base(w, r, "Confirm", ""), a, matching, exact, back})
		return
	}
	var res engine.ActionResult
	var err error
	if a.All {
		res, err = d.b.ActAll(ctx, a.Verb, a.Filter)
	} else {
		res, err = d.b.Act(ctx, a.Verb, a.IDs...)
	}
	msg := fmt.Sprintf("%s: %d task%s", verbPast[a.Verb], res.Done, plural(res.Done))
	if res.Skipped > 0 {
		msg += fmt.Sprintf("; %d skipped (no longer in a state it applies to)", res.Skipped)
	}
	if res.Missing > 0 {
		msg += fmt.Sprintf("; %d no longer exist", res.Missing)
	}
	log := d.opts.Logger.With("verb", a.Verb, "queue", a.Filter.Queue, "state", a.Filter.State, "all", a.All,
		"done", res.Done, "skipped", res.Skipped, "missing", res.Missing, "remote", r.RemoteAddr)
	if err != nil {
		log.Warn("dashboard: action failed part way", "err", err)
		if script {
			replyJSON(w, http.StatusInternalServerError, struct {
				engine.ActionResult
				Error string `json:"error"`
			}{res, err.Error()})
			return
		}
		d.redirectFlash(w, r, back, "err", msg+"; then it failed: "+err.Error())
		return
	}
	log.Info("dashboard: action")
	if script {
		replyJSON(w, http.StatusOK, res)
		return
	}
	d.redirectFlash(w, r, back, "ok", msg)
}

func replyJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// flashCookie carries the outcome of an action to the page the browser
// is sent back to (a cookie rather than the URL, so that no link can put
// words in the dashboard's mouth).
const flashCookie = "bq_flash"

func (d *Dashboard) redirectFlash(w http.ResponseWriter, r *http.Request, to, kind, msg string) {
	d.setCookie(w, r, &http.Cookie{Name: flashCookie, Value: url.QueryEscape(kind + ":" + msg), MaxAge: 60})
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// takeFlash reads the flash cookie and clears it.
func (d *Dashboard) takeFlash(w http.ResponseWriter, r *http.Request) (ok, bad string) {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return "", ""
	}
	d.setCookie(w, r, &http.Cookie{Name: flashCookie, Value: "", MaxAge: -1})
	v, err := url.QueryUnescape(c.Value)
	if err != nil {
		return "", ""
	}
	kind, msg, _ := strings.Cut(v, ":")
	if kind == "ok" {
		return msg, ""
	}
	return "", msg
}
