package cluster

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/gomodule/redigo/redis"
)

// scriptConn is a redis.Conn that records what is sent and answers "OK" to
// ASKING, "QUEUED" inside MULTI and the command's name otherwise.
type scriptConn struct {
	sent    []string
	replies []interface{}
	multi   bool
}

func (s *scriptConn) Close() error { return nil }
func (s *scriptConn) Err() error   { return nil }
func (s *scriptConn) Flush() error { return nil }
func (s *scriptConn) Send(cmd string, args ...interface{}) error {
	s.sent = append(s.sent, cmd)
	switch {
	case cmd == "ASKING":
		s.replies = append(s.replies, "OK")
	case cmd == "MULTI":
		s.multi = true
		s.replies = append(s.replies, "OK")
	case cmd == "EXEC":
		s.multi = false
		s.replies = append(s.replies, []interface{}{"done"})
	case s.multi:
		s.replies = append(s.replies, "QUEUED")
	default:
		s.replies = append(s.replies, cmd)
	}
	return nil
}
func (s *scriptConn) Receive() (interface{}, error) {
	if len(s.replies) == 0 {
		return nil, errors.New("no reply pending")
	}
	r := s.replies[0]
	s.replies = s.replies[1:]
	return r, nil
}
func (s *scriptConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	if cmd != "" {
		if err := s.Send(cmd, args...); err != nil {
			return nil, err
		}
	}
	all := s.replies
	s.replies = nil
	if cmd == "" {
		return all, nil
	}
	return all[len(all)-1], nil
}

func (s *scriptConn) DoContext(_ context.Context, cmd string, args ...interface{}) (interface{}, error) {
	return s.Do(cmd, args...)
}
func (s *scriptConn) ReceiveContext(context.Context) (interface{}, error) { return s.Receive() }

func TestClusterAskingConn(t *testing.T) {
	sc := &scriptConn{}
	b := &boundConn{c: sc, ctx: context.Background(), asking: true}
	// A WATCH read by Receive, a GET by Do, then MULTI … EXEC read by Do("").
	if err := b.Send("WATCH", "k"); err != nil {
		t.Fatal(err)
	}
	if r, err := b.Receive(); err != nil || r != "WATCH" {
		t.Fatalf("Receive after WATCH = %v, %v", r, err)
	}
	if r, err := b.Do("GET", "k"); err != nil || r != "GET" {
		t.Fatalf("Do GET = %v, %v", r, err)
	}
	for _, c := range []string{"MULTI", "SET", "RPUSH", "EXEC"} {
		if err := b.Send(c); err != nil {
			t.Fatal(err)
		}
	}
	all, err := b.Do("")
	if err != nil {
		t.Fatal(err)
	}
	want := []interface{}{"OK", "QUEUED", "QUEUED", []interface{}{"done"}}
	if !reflect.DeepEqual(all, want) {
		t.Errorf("Do(\"\") = %v, want %v (ASKING replies dropped)", all, want)
	}
	wantSent := []string{"ASKING", "WATCH", "ASKING", "GET", "ASKING", "MULTI", "SET", "RPUSH", "EXEC"}
	if fmt.Sprint(sc.sent) != fmt.Sprint(wantSent) {
		t.Errorf("sent %v, want %v (ASKING before each command outside MULTI only)", sc.sent, wantSent)
	}

	// Without ASK nothing is added.
	sc = &scriptConn{}
	b = &boundConn{c: sc, ctx: context.Background()}
	_ = b.Send("WATCH", "k")
	if _, err := b.Do("GET", "k"); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(sc.sent) != "[WATCH GET]" {
		t.Errorf("sent %v without ASK", sc.sent)
	}
	var _ redis.Conn = b
}
