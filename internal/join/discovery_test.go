package join

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/tlsutil"
)

// discoveryServer serves c's join and discovery endpoints and counts what reached each; answer,
// when set, replaces the discovery answer (a driver that tampers with it).
type discoveryServer struct {
	url                string
	joins, discoveries atomic.Int32
	answer             func(Discovery) Discovery
}

func serveDiscovery(t *testing.T, c *cluster, answer func(Discovery) Discovery) *discoveryServer {
	t.Helper()
	s := &discoveryServer{answer: answer}
	mux := http.NewServeMux()
	mux.Handle(Path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.joins.Add(1)
		c.auth.ServeHTTP(w, r)
	}))
	mux.Handle(DiscoveryPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.discoveries.Add(1)
		if s.answer == nil {
			c.auth.DiscoveryHandler().ServeHTTP(w, r)
			return
		}
		d, err := c.auth.Discover(r.Context(), r.URL.Query().Get("id"))
		if err != nil {
			t.Error(err)
		}
		_ = json.NewEncoder(w).Encode(s.answer(d))
	}))
	ts := httptest.NewUnstartedServer(mux)
	leaf, err := c.auth.CA.Leaf("127.0.0.1", net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	s.url = ts.URL
	return s
}

const bootstrapToken = "vmonjoin.0a1b2c3d.00112233445566778899aabbccddeeff"

func TestPinlessTokenParses(t *testing.T) {
	tok, err := ParseToken(bootstrapToken)
	if err != nil || tok.Pin != "" || tok.ID != "0a1b2c3d" || tok.String() != bootstrapToken {
		t.Fatalf("ParseToken(%q) = %+v, %v", bootstrapToken, tok, err)
	}
	for _, bad := range []string{"vmonjoin.0a1b2c3d", "vmonjoin.0a1b2c3d.0011", "vmonjoin.0a1b2c3d.00112233445566778899aabbccddeeff.pin"} {
		if _, err := ParseToken(bad); err == nil {
			t.Errorf("ParseToken(%q) accepted", bad)
		}
	}
}

// A node with the bootstrap token (no pin) finds the cluster CA by discovery and joins; every node
// of a DaemonSet can, with the same token.
func TestDiscoveryJoinsWithAPinlessToken(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	tok, _ := ParseToken(bootstrapToken)
	if err := c.auth.EnsureBootstrapToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	s := serveDiscovery(t, c, nil)
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		creds, err := Node(ctx, s.url, bootstrapToken, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(creds.CAPEM) != string(c.auth.CA.CertPEM) {
			t.Fatalf("%s did not get the cluster CA", name)
		}
	}
	if s.discoveries.Load() != 3 || s.joins.Load() != 3 {
		t.Fatalf("%d discoveries and %d joins, want 3 and 3", s.discoveries.Load(), s.joins.Load())
	}
	// A driver restarting with the same file keeps the token good; a new token replaces it.
	if err := c.auth.EnsureBootstrapToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if _, err := Node(ctx, s.url, bootstrapToken, "node-d"); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	rotated, _ := ParseToken("vmonjoin.99887766.ffeeddccbbaa99887766554433221100")
	if err := c.auth.EnsureBootstrapToken(ctx, rotated); err != nil {
		t.Fatal(err)
	}
	if _, err := Node(ctx, s.url, rotated.String(), "node-e"); err != nil {
		t.Fatalf("the new bootstrap token: %v", err)
	}
	before := s.joins.Load()
	if _, err := Node(ctx, s.url, bootstrapToken, "node-f"); err == nil || !strings.Contains(err.Error(), "not vouched for") {
		t.Fatalf("the replaced bootstrap token: %v", err)
	}
	if s.joins.Load() != before {
		t.Fatal("a node with the replaced token sent its secret")
	}
	// Issued tokens are not touched by a bootstrap token's replacement.
	issued := c.token(t, time.Hour, 1)
	if err := c.auth.EnsureBootstrapToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if _, err := Node(ctx, s.url, issued, "node-g"); err != nil {
		t.Fatalf("an issued token after a bootstrap token changed: %v", err)
	}
	pinned, _ := ParseToken(issued)
	if err := c.auth.EnsureBootstrapToken(ctx, pinned); err == nil {
		t.Fatal("a token with a pin was taken as a bootstrap token")
	}
}

// A wrong secret, or an id the driver does not know, fails at discovery: the node sends neither
// its secret nor its CSR.
func TestDiscoveryRefusesAWrongSecret(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	tok, _ := ParseToken(bootstrapToken)
	if err := c.auth.EnsureBootstrapToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	s := serveDiscovery(t, c, nil)
	for name, bad := range map[string]Token{
		"wrong secret": {ID: tok.ID, Secret: strings.Repeat("0", 32)},
		"unknown id":   {ID: "deadbeef", Secret: tok.Secret},
	} {
		_, err := Node(ctx, s.url, bad.String(), "node-a")
		if err == nil || !strings.Contains(err.Error(), "not vouched for by the join token") {
			t.Errorf("%s: got %v", name, err)
		}
	}
	if s.joins.Load() != 0 {
		t.Fatalf("%d join requests reached the driver: the node sent its secret", s.joins.Load())
	}
	if s.discoveries.Load() != 2 {
		t.Fatalf("%d discoveries, want 2", s.discoveries.Load())
	}
	// An issued (pinned) token used without its pin works the same way: its id is in the store.
	issued, _ := ParseToken(c.token(t, time.Hour, 1))
	issued.Pin = ""
	if _, err := Node(ctx, s.url, issued.String(), "node-b"); err != nil {
		t.Fatalf("an issued token without its pin: %v", err)
	}
}

// A CA swapped in the answer (its HMAC kept, or made for the other CA without the secret) is
// refused before the node sends anything.
func TestDiscoveryRefusesATamperedCA(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	tok, _ := ParseToken(bootstrapToken)
	if err := c.auth.EnsureBootstrapToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	other, err := tlsutil.LoadOrCreateCA(t.TempDir(), "vmon cluster CA")
	if err != nil {
		t.Fatal(err)
	}
	s := serveDiscovery(t, c, func(d Discovery) Discovery {
		d.CA = string(other.CertPEM)
		return d
	})
	_, err = Node(ctx, s.url, bootstrapToken, "node-a")
	if err == nil || !strings.Contains(err.Error(), "not vouched for") {
		t.Fatalf("a swapped CA: %v", err)
	}
	s.answer = func(d Discovery) Discovery {
		d.MAC = "AAAA" + d.MAC[4:]
		return d
	}
	if _, err = Node(ctx, s.url, bootstrapToken, "node-a"); err == nil || !strings.Contains(err.Error(), "not vouched for") {
		t.Fatalf("a tampered MAC: %v", err)
	}
	if s.joins.Load() != 0 {
		t.Fatal("the node sent its secret to a driver whose CA it could not check")
	}
}

// A driver whose CA the discovery vouched for must still present a certificate of that CA: one
// that answers discovery honestly (it relays another driver's answer) but serves the join with a
// certificate of another CA gets nothing.
func TestDiscoveryStillChecksTheJoinChannel(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	tok, _ := ParseToken(bootstrapToken)
	if err := c.auth.EnsureBootstrapToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	impostor := newCluster(t)
	relay := serveDiscovery(t, impostor, nil)
	relay.answer = func(Discovery) Discovery {
		d, _ := c.auth.Discover(ctx, tok.ID)
		return d
	}
	_, err := Node(ctx, relay.url, bootstrapToken, "node-a")
	if err == nil || !strings.Contains(err.Error(), "does not chain to the CA the join token pins") {
		t.Fatalf("got %v", err)
	}
	if relay.joins.Load() != 0 {
		t.Fatal("the node's join reached a server without the cluster's certificate")
	}
}

// Pinned tokens never ask for discovery.
func TestPinnedTokensSkipDiscovery(t *testing.T) {
	c := newCluster(t)
	s := serveDiscovery(t, c, nil)
	if _, err := Node(context.Background(), s.url, c.token(t, time.Hour, 1), "node-a"); err != nil {
		t.Fatal(err)
	}
	if s.discoveries.Load() != 0 || s.joins.Load() != 1 {
		t.Fatalf("%d discoveries and %d joins, want 0 and 1", s.discoveries.Load(), s.joins.Load())
	}
}

// An unknown id is answered as a known one is, and the same way at every ask: the answers do not
// tell a guesser which ids exist.
func TestDiscoveryOfAnUnknownIDIsStable(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	a, err := c.auth.Discover(ctx, "deadbeef")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.auth.Discover(ctx, "deadbeef")
	other, _ := c.auth.Discover(ctx, "feedbeef")
	if a.MAC != b.MAC || a.MAC == other.MAC || a.CA != string(c.auth.CA.CertPEM) {
		t.Fatalf("unknown ids: %q, %q, %q", a.MAC, b.MAC, other.MAC)
	}
	// A second driver of the cluster (the same gossip key) answers the same.
	twin := &Authority{CA: c.auth.CA, Tokens: c.auth.Tokens, GossipKey: c.auth.GossipKey}
	if d, _ := twin.Discover(ctx, "deadbeef"); d.MAC != a.MAC {
		t.Fatal("two drivers of one cluster answer an unknown id differently")
	}
}
