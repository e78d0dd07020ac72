package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// StartTLS starts a single redis-server that accepts only TLS, on a free
// loopback port, with a certificate authority, a server certificate and a
// client certificate made for this test (valid for an hour: nothing is
// committed that could expire). Clients must present the client
// certificate: Client and TLSConfig carry it.
func StartTLS(t testing.TB, extra ...string) *Server {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCert(t, nil, nil, "redistest CA", true)
	server, serverKey := newCert(t, ca, caKey, "127.0.0.1", false)
	client, clientKey := newCert(t, ca, caKey, "redistest client", false)
	files := map[string][]byte{
		"ca.crt":     pemCert(ca),
		"server.crt": pemCert(server),
		"server.key": pemKey(t, serverKey),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	cfg := &tls.Config{
		RootCAs:      pool,
		ServerName:   "127.0.0.1",
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{client.Raw}, PrivateKey: clientKey, Leaf: client}},
	}
	s := &Server{t: t, dir: t.TempDir(), tls: cfg}
	s.argsOn = func(port int) []string {
		return append([]string{
			"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--tls-cert-file", filepath.Join(dir, "server.crt"), "--tls-key-file", filepath.Join(dir, "server.key"),
			"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"), "--tls-auth-clients", "yes",
			"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"), "--daemonize", "no",
		}, extra...)
	}
	s.startOnFreePort()
	return s
}

// TLSConfig returns the TLS configuration clients of a StartTLS server use
// (the test's CA and client certificate); nil for a plain server.
func (s *Server) TLSConfig() *tls.Config { return s.tls }

// newCert makes an ECDSA P-256 certificate for name, signed by parent (self
// signed when parent is nil), valid from a minute ago for an hour. A name
// that is an IP address is put in the IP SANs.
func newCert(t testing.TB, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, name string, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		tmpl.ExtKeyUsage = nil
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func pemKey(t testing.TB, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}
