package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/adjust/rmq/v5"
	"github.com/redis/go-redis/v9"
)

// rmqImpl drives github.com/adjust/rmq/v5 through its public API. rmq has
// no delayed tasks, so it takes part only in the enqueue and e2e scenarios.
//
//   - Enqueue: Queue.PublishBytes(one) = LPUSH to rmq::queue::[<ns>]::ready;
//   - EnqueueBatch: Queue.PublishBytes(many...) = one variadic LPUSH;
//   - Consume: StartConsuming(prefetchLimit, pollDuration) with the values
//     of rmq's example consumer (prefetch 1000, poll 100ms), the poll being
//     Env.Poll when set and the prefetch at least 2×workers (rmq's README
//     asks for more than the number of consumers); one AddConsumerFunc per
//     worker, each acknowledging with Delivery.Ack (LREM from the
//     connection's unacked list). rmq's fetch loop moves tasks one
//     RPOPLPUSH at a time and sleeps pollDuration after every round, so its
//     throughput is bounded by about prefetchLimit/pollDuration.
//
// The queue name and the connection tag are the namespace. rmq also writes
// members into the global sets rmq::connections and rmq::queues (removed by
// Cleanup). rmq offers no way to stop a connection's heartbeat goroutine
// (one SET per second); Close closes the Redis client under it, after which
// that goroutine only fails locally.
type rmqImpl struct {
	rc    *redis.Client
	conn  rmq.Connection
	queue rmq.Queue
	ns    string
	poll  time.Duration
	logf  func(string, ...any)
	errs  chan error
	done  chan struct{}
}

func init() { register("rmq", func() Impl { return &rmqImpl{} }) }

// rmqDefaultPoll and rmqPrefetch are the values of rmq's example consumer
// (example/consumer/main.go).
const (
	rmqDefaultPoll = 100 * time.Millisecond
	rmqPrefetch    = 1000
)

// Name implements Impl.
func (r *rmqImpl) Name() string { return "rmq" }

// Open implements Impl.
func (r *rmqImpl) Open(ctx context.Context, env Env) error {
	r.ns = env.Namespace
	r.poll = env.Poll
	if r.poll <= 0 {
		r.poll = rmqDefaultPoll
	}
	r.logf = env.Logf
	r.rc = redis.NewClient(&redis.Options{Addr: env.Addr, PoolSize: 256})
	if err := r.rc.Ping(ctx).Err(); err != nil {
		return err
	}
	r.errs = make(chan error, 64)
	r.done = make(chan struct{})
	go r.drainErrors()
	conn, err := rmq.OpenConnectionWithRedisClient(r.ns, r.rc, r.errs)
	if err != nil {
		return err
	}
	r.conn = conn
	r.queue, err = conn.OpenQueue(r.ns)
	return err
}

// drainErrors logs rmq's background errors until Close.
func (r *rmqImpl) drainErrors() {
	for {
		select {
		case <-r.done:
			return
		case err := <-r.errs:
			r.logf("rmq: %v", err)
		}
	}
}

// Close implements Impl.
func (r *rmqImpl) Close() error {
	if r.conn != nil {
		<-r.conn.StopAllConsuming()
	}
	if r.done != nil {
		close(r.done)
	}
	if r.rc != nil {
		return r.rc.Close()
	}
	return nil
}

// KeyPatterns implements Impl.
func (r *rmqImpl) KeyPatterns() []string {
	return []string{
		`rmq::queue::\[` + r.ns + `\]::*`,
		"rmq::connection::" + r.ns + "-*",
	}
}

// Cleanup implements Cleaner.
func (r *rmqImpl) Cleanup(ctx context.Context) error {
	if err := r.rc.SRem(ctx, "rmq::queues", r.ns).Err(); err != nil {
		return err
	}
	conns, err := r.rc.SMembers(ctx, "rmq::connections").Result()
	if err != nil {
		return err
	}
	for _, c := range conns {
		if strings.HasPrefix(c, r.ns+"-") {
			if err := r.rc.SRem(ctx, "rmq::connections", c).Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// Enqueue implements Impl.
func (r *rmqImpl) Enqueue(ctx context.Context, t Task) error {
	return r.queue.PublishBytes(encodeTask(t))
}

// EnqueueBatch implements Batcher.
func (r *rmqImpl) EnqueueBatch(ctx context.Context, ts []Task) error {
	bs := make([][]byte, len(ts))
	for i, t := range ts {
		bs[i] = encodeTask(t)
	}
	return r.queue.PublishBytes(bs...)
}

// Consume implements Impl (cfg.Dispatchers is ignored: nothing is delayed).
func (r *rmqImpl) Consume(ctx context.Context, cfg ConsumeConfig, h Handler) (func() error, error) {
	// A queue object consumes at most once, so each Consume opens its own.
	q, err := r.conn.OpenQueue(r.ns)
	if err != nil {
		return nil, err
	}
	workers := max(cfg.Workers, 1)
	if err := q.StartConsuming(int64(max(rmqPrefetch, 2*workers)), r.poll); err != nil {
		return nil, err
	}
	hctx, cancel := context.WithCancel(context.Background())
	for i := range workers {
		_, err := q.AddConsumerFunc(fmt.Sprintf("w%d", i), func(dl rmq.Delivery) {
			d, err := decodeTask([]byte(dl.Payload()))
			if err == nil {
				err = h(hctx, d)
			}
			if err != nil {
				r.logf("rmq: handler: %v", err)
				if err := dl.Reject(); err != nil {
					r.logf("rmq: reject: %v", err)
				}
				return
			}
			if err := dl.Ack(); err != nil {
				r.logf("rmq: ack: %v", err)
			}
		})
		if err != nil {
			cancel()
			<-q.StopConsuming()
			return nil, err
		}
	}
	return func() error {
		<-q.StopConsuming()
		cancel()
		return nil
	}, nil
}
