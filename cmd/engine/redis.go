package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/bucketq/bucketq/redis24"
	"github.com/bucketq/bucketq/txn"
	"github.com/gomodule/redigo/redis"
)

// refusedError is Redis answering AUTH, SELECT or the first PING with an
// error: a wrong password, a database that does not exist, a password
// that is required but not configured. Retrying cannot help.
type refusedError struct {
	addr, what string
	reply      error
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("Redis at %s refused %s: %v", e.addr, e.what, e.reply)
}

func (e *refusedError) Unwrap() error { return e.reply }

// hint says which setting to look at for a refused connection.
func (e *refusedError) hint() string {
	msg := strings.ToUpper(e.reply.Error())
	switch {
	case e.what == "AUTH" && (strings.Contains(msg, "NO PASSWORD IS SET") || strings.Contains(msg, "WITHOUT ANY PASSWORD")):
		return "the server has no password: remove redis.password (ENGINE_REDIS_PASSWORD)"
	case e.what == "AUTH":
		return "wrong user name or password? check redis.user and redis.password (ENGINE_REDIS_USER, ENGINE_REDIS_PASSWORD)"
	case e.what == "SELECT":
		return "no such database? check redis.db (ENGINE_REDIS_DB)"
	}
	if strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "NOT PERMITTED") || strings.Contains(msg, "AUTH") {
		return "the server needs a password: set redis.password (ENGINE_REDIS_PASSWORD)"
	}
	return "check the redis settings"
}

// tlsConfig builds the TLS configuration, reading the CA file and the
// client certificate and key.
func tlsConfig(rs RedisSettings) (*tls.Config, error) {
	conf := &tls.Config{ServerName: rs.TLS.ServerName, InsecureSkipVerify: rs.TLS.InsecureSkipVerify} // #nosec G402 -- opt-in setting
	if rs.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(rs.TLS.CertFile, rs.TLS.KeyFile)
		if err != nil {
			return nil, &ConfigError{Origin: "config", Key: "redis.tls.cert_file", Msg: err.Error()}
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	if rs.TLS.CAFile != "" {
		pem, err := os.ReadFile(rs.TLS.CAFile)
		if err != nil {
			return nil, &ConfigError{Origin: "config", Key: "redis.tls.ca_file", Msg: err.Error()}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &ConfigError{Origin: "config", Key: "redis.tls.ca_file", Msg: rs.TLS.CAFile + ": no PEM certificates found"}
		}
		conf.RootCAs = pool
	}
	return conf, nil
}

// dialer returns the pool's dial function. AUTH takes the password alone
// (the Redis 2.4 form), or the user name and password when a user name is
// configured (Redis 6+ only), and SELECT picks the database; an error
// reply to either is a *refusedError. census, if not nil, records every
// command.
func dialer(rs RedisSettings, census *redis24.Census, extra ...redis24.Option) (func(context.Context) (redis.Conn, error), error) {
	opts := []redis.DialOption{
		redis.DialConnectTimeout(rs.DialTimeout),
		redis.DialReadTimeout(rs.ReadTimeout),
		redis.DialWriteTimeout(rs.WriteTimeout),
	}
	if rs.TLS.Enabled {
		conf, err := tlsConfig(rs)
		if err != nil {
			return nil, err
		}
		opts = append(opts, redis.DialUseTLS(true), redis.DialTLSConfig(conf), redis.DialTLSSkipVerify(rs.TLS.InsecureSkipVerify))
	}
	var wrapOpts []redis24.Option
	if census != nil {
		wrapOpts = append(wrapOpts, redis24.WithCensus(census))
	}
	wrapOpts = append(wrapOpts, extra...)
	auth := []any{rs.Password}
	if rs.User != "" {
		auth = []any{rs.User, rs.Password}
		wrapOpts = append(wrapOpts, redis24.AllowAuthUser())
	}
	return func(ctx context.Context) (redis.Conn, error) {
		c, err := redis.DialContext(ctx, "tcp", rs.Addr, opts...)
		if err != nil {
			return nil, err
		}
		c = redis24.Wrap(c, wrapOpts...)
		if rs.Password != "" || rs.User != "" {
			if _, err := c.Do("AUTH", auth...); err != nil {
				c.Close()
				return nil, classify(rs.Addr, "AUTH", err)
			}
		}
		if rs.DB != 0 {
			if _, err := c.Do("SELECT", rs.DB); err != nil {
				c.Close()
				return nil, classify(rs.Addr, "SELECT", err)
			}
		}
		return c, nil
	}, nil
}

// classify makes an error reply a *refusedError and leaves network
// errors as they are.
func classify(addr, what string, err error) error {
	var re redis.Error
	if errors.As(err, &re) {
		return &refusedError{addr: addr, what: what, reply: err}
	}
	return err
}

// newPool returns the pool every command uses: connections wrapped by
// redis24.Wrap, idle ones PINGed when older than a minute.
func newPool(rs RedisSettings, size int, census *redis24.Census) (*redis.Pool, error) {
	if p, err := modePool(rs, size, census); p != nil || err != nil {
		return p, err // config_redis_mode.go
	}
	dial, err := dialer(rs, census)
	if err != nil {
		return nil, err
	}
	return &redis.Pool{
		DialContext: dial,
		MaxIdle:     size,
		MaxActive:   size,
		Wait:        true,
		IdleTimeout: 5 * time.Minute,
		TestOnBorrow: func(c redis.Conn, t time.Time) error {
			if time.Since(t) < time.Minute {
				return nil
			}
			_, err := c.Do("PING")
			return err
		},
	}, nil
}

// ping sends one PING on a pooled connection.
func ping(ctx context.Context, pool *redis.Pool, addr string) error {
	conn, err := pool.GetContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = redis.DoContext(conn, ctx, "PING")
	return classify(addr, "PING", err)
}

// transient reports whether an error reply may go away on its own.
func transient(err error) bool {
	if errors.Is(err, txn.ErrNotRun) {
		return true // a redirection or no master yet (config_redis_mode.go)
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return true
	}
	msg := strings.ToUpper(re.Error())
	return strings.HasPrefix(msg, "LOADING") || strings.HasPrefix(msg, "BUSY") || strings.HasPrefix(msg, "MASTERDOWN")
}

// waitForRedis PINGs until Redis answers, backing off from 100 ms to 10 s
// and logging each wait. A refused AUTH or SELECT (or any other error
// reply but LOADING and the like) is returned at once: retrying cannot
// fix it. It returns ctx's error if ctx ends first.
func waitForRedis(ctx context.Context, pool *redis.Pool, addr string, log *slog.Logger) error {
	d := 100 * time.Millisecond
	for try := 1; ; try++ {
		err := ping(ctx, pool, addr)
		if err == nil {
			if try > 1 {
				log.Info("connected to Redis", "addr", addr, "tries", try)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var re *refusedError
		if errors.As(err, &re) && (re.what != "PING" || !transient(re.reply)) {
			return err
		}
		wait := d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
		log.Warn("waiting for Redis at "+addr, "err", err, "retry_in", wait.Round(time.Millisecond).String(), "tries", try)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		d = min(2*d, 10*time.Second)
	}
}
