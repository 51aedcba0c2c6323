package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// writeCerts writes a CA and a server certificate for "redis.test" and
// 127.0.0.1 signed by it; it returns the CA, cert and key file names. A
// client certificate and key signed by the same CA are client.pem and
// client.key in dir.
func writeCerts(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "redis.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"redis.test"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cliKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	cliTmpl := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "engine"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	cliDER, err := x509.CreateCertificate(rand.Reader, cliTmpl, caCert, &cliKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	cliKeyDER, _ := x509.MarshalECPrivateKey(cliKey)
	write("client.pem", "CERTIFICATE", cliDER)
	write("client.key", "EC PRIVATE KEY", cliKeyDER)
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}

// startTLSServer starts a TLS-only redis-server with extra arguments and
// returns its address once it accepts TLS connections.
func startTLSServer(h *harness, cert, key, ca string, extra ...string) string {
	t := h.t
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	args := append([]string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca,
		"--save", "", "--appendonly", "no", "--dir", t.TempDir()}, extra...)
	srv := exec.Command(bin, args...)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cliCert, err := tls.LoadX509KeyPair(filepath.Join(h.dir, "client.pem"), filepath.Join(h.dir, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	h.eventually(10*time.Second, "the TLS server", func() bool {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cliCert}}) // #nosec G402 -- readiness probe
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// TestE2ETLSClientCertACLUser: against a server that checks client
// certificates (tls-auth-clients yes, its default) and has an ACL user,
// engine logs in with a client certificate and AUTH user password; without
// the certificate it fails naming the certificate, and a wrong password
// for the user is refused with a hint naming redis.user.
func TestE2ETLSClientCertACLUser(t *testing.T) {
	h := newHarness(t)
	ca, cert, key := writeCerts(t, h.dir)
	addr := startTLSServer(h, cert, key, ca, "--tls-auth-clients", "yes",
		"--user", "app", "on", ">app-pw", "~*", "&*", "+@all", "--user", "default", "off")
	base := append([]string(nil), h.env...)
	good := []string{"ENGINE_REDIS_ADDR=" + addr, "ENGINE_REDIS_TLS_ENABLED=true", "ENGINE_REDIS_TLS_CA_FILE=" + ca,
		"ENGINE_REDIS_TLS_SERVER_NAME=redis.test", "ENGINE_REDIS_USER=app", "ENGINE_REDIS_PASSWORD=app-pw",
		"ENGINE_REDIS_TLS_CERT_FILE=" + filepath.Join(h.dir, "client.pem"), "ENGINE_REDIS_TLS_KEY_FILE=" + filepath.Join(h.dir, "client.key")}
	h.env = append(append([]string(nil), base...), good...)
	h.enqueue("--type", "x", "--queue", "acl")
	if st := h.stats("acl"); st.Ready != 1 {
		t.Errorf("stats = %+v, want 1 ready", st)
	}
	for _, c := range []struct {
		name string
		env  []string
		code int
		want string
	}{
		{"no client certificate", good[:6], exitFailure, "set redis.tls.cert_file and redis.tls.key_file"},
		{"wrong password", append(good[:5:5], "ENGINE_REDIS_PASSWORD=nope", good[6], good[7]), exitUsage, "check redis.user and redis.password"},
		{"no user", append(good[:4:4], good[5:]...), exitUsage, "refused AUTH"},
		{"key without certificate", append(good[:6:6], good[7]), exitUsage, "redis.tls.cert_file"},
	} {
		h.env = append(append([]string(nil), base...), c.env...)
		_, errOut, code := h.cli("stats")
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", c.name, code, errOut, c.code, c.want)
		}
	}
}

// TestE2ETLSPasswordDatabase: the binary reaches a TLS-only server with a
// password and a database number; a missing CA, a wrong server name, a
// missing password and a database that does not exist are clear errors.
func TestE2ETLSPasswordDatabase(t *testing.T) {
	h := newHarness(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found: %v", err)
	}
	ca, cert, key := writeCerts(t, h.dir)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no",
		"--requirepass", "s3cret", "--save", "", "--appendonly", "no", "--dir", h.dir)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	h.eventually(10*time.Second, "the TLS server", func() bool {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // #nosec G402 -- readiness probe
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	base := append([]string(nil), h.env...)
	with := func(extra ...string) { h.env = append(append([]string(nil), base...), extra...) }
	good := []string{"ENGINE_REDIS_ADDR=" + addr, "ENGINE_REDIS_TLS_ENABLED=true", "ENGINE_REDIS_TLS_CA_FILE=" + ca,
		"ENGINE_REDIS_TLS_SERVER_NAME=redis.test", "ENGINE_REDIS_PASSWORD=s3cret"}

	with(append(good, "ENGINE_REDIS_DB=3")...)
	h.enqueue("--type", "x", "--queue", "in-db-3")
	if st := h.stats("in-db-3"); st.Ready != 1 {
		t.Errorf("stats in database 3 = %+v, want 1 ready", st)
	}
	with(good...)
	var st statsJSON
	if err := json.Unmarshal([]byte(h.ok("stats", "--json")), &st); err != nil || len(st.Queues) != 0 {
		t.Errorf("database 0 has queues %+v (err %v): SELECT was not sent", st.Queues, err)
	}

	for _, c := range []struct {
		name string
		env  []string
		code int
		want string
	}{
		{"no CA", good[:2], exitFailure, "certificate"},
		{"wrong server name", append(good[:3:3], "ENGINE_REDIS_TLS_SERVER_NAME=other.test", good[4]), exitFailure, "certificate"},
		{"no password", good[:4], exitUsage, "set redis.password"},
		{"wrong password", append(good[:4:4], "ENGINE_REDIS_PASSWORD=nope"), exitUsage, "refused AUTH"},
		{"no such database", append(good, "ENGINE_REDIS_DB=99"), exitUsage, "refused SELECT"},
		{"missing CA file", append(good[:2:2], "ENGINE_REDIS_TLS_CA_FILE="+filepath.Join(h.dir, "nope.pem")), exitUsage, "redis.tls.ca_file"},
	} {
		with(c.env...)
		_, errOut, code := h.cli("stats")
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", c.name, code, errOut, c.code, c.want)
		}
	}
	with(good[:4]...)
	if _, errOut, code := h.cli("run"); code != exitUsage || !strings.Contains(errOut, "NOAUTH") {
		t.Errorf("run without the password: exit %d, stderr %q", code, errOut)
	}
}
