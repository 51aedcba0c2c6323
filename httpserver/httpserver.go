// Package httpserver is the HTTP side of a bucketq process: /healthz (the
// process is alive), /readyz (Redis answers a PING within a short deadline
// and the process's own components report ready), and whatever else the
// process mounts with [Server.Handle] (the dashboard, a metrics handler).
//
// A program that does not import this package links none of it: the
// engine itself serves no HTTP.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// DefaultPingTimeout bounds the PING of one /readyz request.
const DefaultPingTimeout = time.Second

// shutdownWait bounds how long Serve waits for open requests once its
// context ends.
const shutdownWait = 5 * time.Second

// Options configures [New].
type Options struct {
	// Addr is host:port to listen on. An empty host (":9090") means the
	// loopback address 127.0.0.1; any other interface must be named.
	Addr string
	// Pool reaches the Redis server /readyz checks; nil leaves Redis out
	// of the check.
	Pool *redis.Pool
	// Ready reports whether this process's components are running; nil
	// means nothing beyond Redis is checked. It must return quickly and is
	// given a context bounded by PingTimeout.
	Ready func(context.Context) error
	// Detail, when set, adds lines to /readyz's body, ready or not (the
	// Redis memory policy, say). It is given a context bounded by
	// PingTimeout; an error is shown in its place.
	Detail func(context.Context) (string, error)
	// PingTimeout bounds the readiness check; 0 is DefaultPingTimeout.
	PingTimeout time.Duration
	// Logger receives the server's errors; nil discards them.
	Logger *slog.Logger
}

// Server is an HTTP server with health endpoints and mounted handlers.
type Server struct {
	opts Options
	mux  *http.ServeMux
}

// New returns a server for opts. It does not listen yet: see [Server.Serve].
func New(opts Options) (*Server, error) {
	addr, err := ResolveAddr(opts.Addr)
	if err != nil {
		return nil, err
	}
	opts.Addr = addr
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = DefaultPingTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		plain(w, http.StatusOK, "ok\n")
	})
	s.mux.HandleFunc("GET /readyz", s.readyz)
	return s, nil
}

// ResolveAddr checks that addr is host:port and puts the loopback address
// in place of an empty host.
func ResolveAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return "", fmt.Errorf("httpserver: address %q: want host:port, e.g. 127.0.0.1:9090", addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// Addr is the address the server listens on (after ResolveAddr).
func (s *Server) Addr() string { return s.opts.Addr }

// Handle mounts h at pattern (http.ServeMux syntax), e.g. "/metrics" for
// a metrics handler or "/" for the dashboard. Call it before Serve.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler is the server's whole handler: the health endpoints and what
// was mounted, with headers that keep responses out of shared caches.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		s.mux.ServeHTTP(w, r)
	})
}

// Check runs the readiness check once: nil when Redis answered PING and
// the components report ready.
func (s *Server) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.PingTimeout)
	defer cancel()
	var errs []error
	if s.opts.Pool != nil {
		if err := pingRedis(ctx, s.opts.Pool); err != nil {
			errs = append(errs, fmt.Errorf("redis: %w", err))
		}
	}
	if s.opts.Ready != nil {
		if err := s.opts.Ready(ctx); err != nil {
			errs = append(errs, fmt.Errorf("components: %w", err))
		}
	}
	return errors.Join(errs...)
}

func pingRedis(ctx context.Context, pool *redis.Pool) error {
	conn, err := pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	reply, err := redis.String(redis.DoContext(conn, ctx, "PING"))
	if err == nil && reply != "PONG" {
		err = fmt.Errorf("PING answered %q", reply)
	}
	return err
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	detail := ""
	if s.opts.Detail != nil {
		ctx, cancel := context.WithTimeout(r.Context(), s.opts.PingTimeout)
		d, err := s.opts.Detail(ctx)
		cancel()
		if err != nil {
			d = "detail unavailable: " + err.Error()
		}
		detail = strings.TrimRight(d, "\n") + "\n"
	}
	if err := s.Check(r.Context()); err != nil {
		plain(w, http.StatusServiceUnavailable, "not ready: "+strings.ReplaceAll(err.Error(), "\n", "; ")+"\n"+detail)
		return
	}
	plain(w, http.StatusOK, "ready\n"+detail)
}

func plain(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}

// Listen opens the server's listener.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("httpserver: listen on %s: %w", s.opts.Addr, err)
	}
	return ln, nil
}

// Serve serves on ln until ctx ends, then stops accepting and waits a few
// seconds for open requests. It returns nil after a stop by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(s.opts.Logger.Handler(), slog.LevelWarn)}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("httpserver: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	<-done
	return nil
}
