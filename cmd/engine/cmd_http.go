package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/bucketq/bucketq/dashboard"
	"github.com/bucketq/bucketq/engine"
	"github.com/bucketq/bucketq/httpserver"
	"github.com/gomodule/redigo/redis"
	"github.com/spf13/cobra"
)

// envHTTPToken holds the HTTP token when http.token_file is not set. It is
// not a setting (a secret has no place in config.yaml) and is never passed
// on to handler commands.
const envHTTPToken = "ENGINE_HTTP_TOKEN"

// envHTTPReadToken holds the read token when http.read_token_file is not
// set, like envHTTPToken.
const envHTTPReadToken = "ENGINE_HTTP_READ_TOKEN"

// dashboardPoolSize is the connections of the dashboard and /metrics in
// `engine run --http`: a pool of their own, so that reading pages never
// takes a connection the workers wait for.
const dashboardPoolSize = 6

// defaultDashboardAddr is where `engine dashboard` listens without
// http.addr or --http.
const defaultDashboardAddr = "127.0.0.1:9090"

// httpToken is the token that allows changes through HTTP: the content of
// http.token_file, else $ENGINE_HTTP_TOKEN, else none.
func (a *app) httpToken(set *Settings) (string, error) {
	return a.readToken(set, "http.token_file", set.HTTP.TokenFile, envHTTPToken)
}

// httpReadToken is the token needed to see the dashboard and /metrics:
// the content of http.read_token_file, else $ENGINE_HTTP_READ_TOKEN, else
// none (they are open).
func (a *app) httpReadToken(set *Settings) (string, error) {
	return a.readToken(set, "http.read_token_file", set.HTTP.ReadTokenFile, envHTTPReadToken)
}

// readToken is the first line of file (setting key), else the value of
// the variable env when file is "".
func (a *app) readToken(set *Settings, key, file, env string) (string, error) {
	if file == "" {
		v, _ := lookupEnv(a.environ, env)
		return strings.TrimSpace(v), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", &ConfigError{Origin: set.where(key), Key: key, Msg: err.Error()}
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", &ConfigError{Origin: set.where(key), Key: key,
			Msg: fmt.Sprintf("%s is empty: want the token on its first line", file)}
	}
	return tok, nil
}

// httpSide is the HTTP server of one process, listening.
type httpSide struct {
	srv  *httpserver.Server
	dash *dashboard.Dashboard
	ln   net.Listener
}

// newHTTP builds the HTTP server of set.HTTP (the health endpoints,
// /metrics and the dashboard) and opens its listener, so that a taken port
// fails at start. ready reports this process's components (nil: none).
// metrics serves /metrics (see metricsHandler). /readyz pings pool; the
// dashboard reads through backend.
func (a *app) newHTTP(set *Settings, pool *redis.Pool, log *slog.Logger, ready func(context.Context) error, metrics http.Handler, backend dashboard.Backend) (*httpSide, error) {
	token, err := a.httpToken(set)
	if err != nil {
		return nil, err
	}
	readToken, err := a.httpReadToken(set)
	if err != nil {
		return nil, err
	}
	if readToken != "" && readToken == token {
		return nil, &ConfigError{Origin: set.where("http.read_token_file"), Key: "http.read_token_file",
			Msg: "the read token is the token: give readers a token of their own"}
	}
	// /readyz's body also says what Redis does when it is full.
	memory := func(ctx context.Context) (string, error) {
		m, err := backend.MemoryPolicy(ctx)
		return "redis memory: " + m.String(), err
	}
	srv, err := httpserver.New(httpserver.Options{Addr: set.HTTP.Addr, Pool: pool, Ready: ready,
		Detail: memory, Logger: log.With("component", "http")})
	if err != nil {
		return nil, err
	}
	dash, err := dashboard.New(backend, dashboard.Options{Token: token, ReadToken: readToken,
		ReadOnly: set.HTTP.ReadOnly, SecureCookies: set.HTTP.SecureCookies, Logger: log.With("component", "dashboard")})
	if err != nil {
		return nil, err
	}
	srv.Handle("/", dash)
	srv.Handle("/metrics", dash.Guard(metrics))
	ln, err := srv.Listen()
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(srv.Addr())
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		if readToken == "" {
			log.Error("the dashboard and /metrics are open to every host that reaches this address: task payloads, results, "+
				"errors, queue and worker names are shown without a token; set http.read_token_file (or "+envHTTPReadToken+
				") or listen on 127.0.0.1", "addr", srv.Addr())
		}
		if token != "" || readToken != "" {
			log.Warn("the dashboard's tokens are sent from other hosts: they travel in clear over HTTP unless a TLS proxy fronts it",
				"addr", srv.Addr())
		}
	}
	mode := "actions need the token"
	switch {
	case set.HTTP.ReadOnly:
		mode = "read-only"
	case token == "":
		mode = "read-only (no token: set http.token_file or " + envHTTPToken + ")"
	}
	if readToken != "" {
		mode += "; seeing it needs the read token"
	}
	log.Info("HTTP server listening", "addr", "http://"+ln.Addr().String()+"/", "dashboard", mode)
	return &httpSide{srv: srv, dash: dash, ln: ln}, nil
}

// serve runs the server and the dashboard's sampler until ctx ends, and
// returns once both have stopped: the caller then closes the pools the
// sampler reads through.
func (h *httpSide) serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var sampler sync.WaitGroup
	defer sampler.Wait()
	defer cancel()
	sampler.Go(func() { _ = h.dash.Run(ctx) })
	return h.srv.Serve(ctx, h.ln)
}

func (a *app) newDashboardCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "serve the web dashboard alone (no dispatcher, reaper or worker)",
		Long: `Serves the web dashboard and /healthz, /readyz over HTTP, for operators who
run the workers elsewhere. It listens on http.addr or --http (default
` + defaultDashboardAddr + `; an empty host is 127.0.0.1). Actions (retry,
cancel, delete, run now) need the token of http.token_file or $` + envHTTPToken + `;
without one, or with http.read_only, the dashboard only shows. With a read
token (http.read_token_file or $` + envHTTPReadToken + `), seeing the dashboard
and /metrics needs it or the token.`,
		Args: cobra.NoArgs,
	}
	c := addCommon(cmd, [3]string{"http", "http.addr", "listen on `host:port`"},
		[3]string{"http-read-token-file", "http.read_token_file", "`file` holding the read token, needed to see the dashboard and /metrics"})
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		set, warnings, err := c.load(a, cmd)
		if err != nil {
			return a.fail("dashboard", err)
		}
		if set.HTTP.Addr == "" {
			set.HTTP.Addr = defaultDashboardAddr
		}
		log := newLogger(a.stderr, set)
		for _, w := range warnings {
			log.Warn(w)
		}
		// Gauges only: the tasks run in other processes, whose own
		// /metrics count them. With shards, the dashboard and the gauges
		// span every lane and /readyz pings lane 0's server.
		eng := set.engineConfig(log)
		pools, closePools, err := lanePools(set, set.poolSize())
		if err != nil {
			return a.fail("dashboard", err)
		}
		defer closePools()
		in, err := engine.NewInspector(eng, pools...)
		if err != nil {
			return a.fail("dashboard", err)
		}
		h, err := a.newHTTP(set, pools[0], log, nil, metricsHandler(in, &eng), in)
		if err != nil {
			return a.fail("dashboard", err)
		}
		if err := h.serve(cmd.Context()); err != nil && !errors.Is(err, context.Canceled) {
			return a.fail("dashboard", err)
		}
		log.Info("stopped")
		return nil
	}
	return cmd
}
