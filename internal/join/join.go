// Package join owns how a node becomes part of a cluster: join tokens the driver issues, the
// handshake in which a node proves a token and gets a certificate for its own key from the
// driver's cluster CA, and the TLS configurations both ends then use (mutual TLS, only this CA).
//
// A token is "vmonjoin.<id>.<secret>.<pin>": the id and a 128-bit secret the driver keeps only as
// a hash (with an expiry and a number of uses), and the pin of the cluster CA's public key, so the
// node checks that it talks to the driver that issued the token before it sends the secret. The
// node's private key never leaves it: it sends a certificate request, and the driver signs a
// certificate naming the node (client and server use, as the node both calls and serves).
//
// With its certificate the node gets the cluster's gossip key (internal/membership encrypts gossip
// with it), inside the same pinned channel.
//
// Discovery. A token may also be written without its pin, "vmonjoin.<id>.<secret>", so that it
// can be made before the cluster CA exists (by Helm, which cannot know the pin): the driver takes
// such a token from a file (EnsureBootstrapToken). A node given one first asks the driver's
// discovery endpoint, over TLS it cannot verify yet, for the cluster CA and an HMAC-SHA256 of the
// CA's certificate (DER) keyed by the token's secret, and checks that HMAC before anything else;
// the pin it then derives from that CA takes the place of a written one, and the join goes on
// exactly as with a pinned token (the driver's certificate must chain to that CA before the node
// sends its secret or its CSR). This is kubeadm's token discovery.
//
// The HMAC's key must be something both ends know, and the driver keeps only the secret's hash:
// the key is that hash (the raw 32 bytes of SHA-256 of the secret), so the store keeps what it
// kept, and a node, which has the secret, computes the same key. What this gives up: a reader of
// the driver's join_tokens table (who has the hashes) can answer a pinless token's discovery with
// a CA of their own, which a pinned token would not let them do; storing the secret instead would
// let that reader join as a node, which is worse. The secret has 128 random bits, so an
// eavesdropper who saw an answer cannot work the secret out of its HMAC. A token id the driver
// does not know (or one expired or used up) is answered with an HMAC under a key derived from the
// cluster's gossip key and the id, which no one outside has and which is the same at every ask
// and from every driver sharing that key, so the answer does not tell a guesser which ids exist;
// the node then fails as with a wrong secret, before it sent either.
//
// It never stores anything itself: tokens go through a TokenStore, keys and certificates are the
// caller's to keep.
package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/tlsutil"
)

// Path is the driver's join endpoint (POST, JSON Request → Response).
const Path = "/cluster/v1/join"

// DiscoveryPath is the driver's discovery endpoint (GET ?id=<token id> → Discovery), for tokens
// written without a pin.
const DiscoveryPath = "/cluster/v1/discover"

// Defaults and bounds.
const (
	DefaultTTL = 24 * time.Hour
	MaxTTL     = 30 * 24 * time.Hour
	// CertValidity is how long a node's certificate lives; a node joins again to renew it.
	CertValidity = 365 * 24 * time.Hour
	tokenPrefix  = "vmonjoin"
	maxBody      = 64 << 10
	// MaxUses bounds the uses of an issued token; a bootstrap token has more (bootstrapUses), which
	// is how the store tells one from the other.
	MaxUses       = 10000
	bootstrapUses = 1 << 30
)

// bootstrapExpiry is a bootstrap token's expiry: none, in effect. Its Secret is what controls it;
// a new token in the file replaces it at the driver's next start.
var bootstrapExpiry = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// nodeOrganization marks the certificates the CA signs for nodes, which never serve a join.
const nodeOrganization = "vibemon node"

var nameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// TokenStore keeps tokens (store.Store).
type TokenStore interface {
	InsertJoinToken(ctx context.Context, t store.JoinToken) error
	UseJoinToken(ctx context.Context, id, hash string, now time.Time) (bool, error)
	// JoinTokenHash is the hash of token id's secret, if the token can still be used at now.
	JoinTokenHash(ctx context.Context, id string, now time.Time) (string, bool, error)
	// PutBootstrapJoinToken keeps t, replacing a token of the same id and every token with more
	// than minUses uses left (an earlier bootstrap token).
	PutBootstrapJoinToken(ctx context.Context, t store.JoinToken, minUses int) error
}

// Token is a parsed join token. Pin is empty in a token written without one (see Discovery).
type Token struct {
	ID, Secret, Pin string
}

func (t Token) String() string {
	if t.Pin == "" {
		return strings.Join([]string{tokenPrefix, t.ID, t.Secret}, ".")
	}
	return strings.Join([]string{tokenPrefix, t.ID, t.Secret, t.Pin}, ".")
}

// ParseToken reads a token as `vmon node join-token` prints it, or one without its pin
// ("vmonjoin.<id>.<secret>": 8 and 32 hex characters).
func ParseToken(s string) (Token, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if (len(parts) != 3 && len(parts) != 4) || parts[0] != tokenPrefix || len(parts[1]) != 8 || len(parts[2]) != 32 ||
		(len(parts) == 4 && !strings.HasPrefix(parts[3], "sha256:")) {
		return Token{}, errdefs.InvalidArgument("not a join token (want %s.<id>.<secret>.sha256:<pin>, as `vmon node join-token` prints, or %s.<id>.<secret>)", tokenPrefix, tokenPrefix)
	}
	if _, err := hex.DecodeString(parts[1] + parts[2]); err != nil {
		return Token{}, errdefs.InvalidArgument("not a join token: id and secret are hex")
	}
	t := Token{ID: parts[1], Secret: parts[2]}
	if len(parts) == 4 {
		t.Pin = parts[3]
	}
	return t, nil
}

func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Authority is the driver's side: it issues tokens and signs joining nodes' certificates.
type Authority struct {
	CA     *tlsutil.CA
	Tokens TokenStore
	// GossipKey encrypts the cluster's gossip (internal/membership); a joining node gets it.
	GossipKey []byte
	// Gossip, when set, lists the gossip addresses a joining node is told to join through.
	Gossip func() []string
	// Now defaults to time.Now (tests).
	Now func() time.Time

	// random stands in for GossipKey in decoy answers when there is none (tests).
	randomOnce sync.Once
	random     [32]byte
}

func (a *Authority) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// IssueToken makes a token good for uses joins within ttl.
func (a *Authority) IssueToken(ctx context.Context, ttl time.Duration, uses int) (Token, error) {
	if ttl <= 0 || ttl > MaxTTL {
		return Token{}, errdefs.InvalidArgument("a join token lives between 1s and %s", MaxTTL)
	}
	if uses < 1 || uses > MaxUses {
		return Token{}, errdefs.InvalidArgument("a join token is good for 1 to %d joins", MaxUses)
	}
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Token{}, err
	}
	t := Token{ID: hex.EncodeToString(b[:4]), Secret: hex.EncodeToString(b[4:]), Pin: a.CA.Pin()}
	now := a.now()
	if err := a.Tokens.InsertJoinToken(ctx, store.JoinToken{ID: t.ID, Hash: hashSecret(t.Secret), CreatedAt: now,
		ExpiresAt: now.Add(ttl), UsesLeft: uses}); err != nil {
		return Token{}, err
	}
	return t, nil
}

// EnsureBootstrapToken makes tok (written without a pin, as a bootstrap file holds it) a token
// nodes can join with any number of times, with no expiry, replacing an earlier bootstrap token:
// a cluster whose nodes all join with one token from a Secret (a Kubernetes DaemonSet).
func (a *Authority) EnsureBootstrapToken(ctx context.Context, tok Token) error {
	if tok.Pin != "" {
		return errdefs.InvalidArgument("a bootstrap token is written without a pin (%s.<id>.<secret>): the pin is the cluster CA's, which the driver has", tokenPrefix)
	}
	return a.Tokens.PutBootstrapJoinToken(ctx, store.JoinToken{ID: tok.ID, Hash: hashSecret(tok.Secret), CreatedAt: a.now(),
		ExpiresAt: bootstrapExpiry, UsesLeft: bootstrapUses}, MaxUses)
}

// Discovery is the driver's answer to a node holding a token without a pin: the cluster CA (PEM)
// and the HMAC-SHA256 of its DER keyed by the SHA-256 of the token's secret (base64).
type Discovery struct {
	CA  string `json:"ca"`
	MAC string `json:"mac"`
}

// discoveryMAC is the HMAC of the CA's DER under the token secret's hash (its 32 bytes).
func discoveryMAC(secretHash, caDER []byte) []byte {
	m := hmac.New(sha256.New, secretHash)
	m.Write(caDER)
	return m.Sum(nil)
}

// Discover answers a discovery for token id. It spends no use of the token.
func (a *Authority) Discover(ctx context.Context, id string) (Discovery, error) {
	hash, ok, err := a.Tokens.JoinTokenHash(ctx, id, a.now())
	if err != nil {
		return Discovery{}, err
	}
	key, err := hex.DecodeString(hash)
	if !ok || err != nil || len(key) != sha256.Size {
		key = a.decoyKey(id)
	}
	return Discovery{CA: string(a.CA.CertPEM),
		MAC: base64.StdEncoding.EncodeToString(discoveryMAC(key, a.CA.Certificate().Raw))}, nil
}

// decoyKey keys the discovery answer for token id when the store has no such token.
func (a *Authority) decoyKey(id string) []byte {
	secret := a.GossipKey
	if len(secret) == 0 {
		a.randomOnce.Do(func() { _, _ = rand.Read(a.random[:]) })
		secret = a.random[:]
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("vmon join discovery decoy\x00" + id))
	return m.Sum(nil)
}

// DiscoveryHandler serves DiscoveryPath.
func (a *Authority) DiscoveryHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			writeErr(w, errdefs.InvalidArgument("use GET"), http.StatusMethodNotAllowed)
			return
		}
		id := r.URL.Query().Get("id")
		if len(id) != 8 {
			writeErr(w, errdefs.InvalidArgument("id: a join token's id (8 hex characters)"), 0)
			return
		}
		d, err := a.Discover(r.Context(), id)
		if err != nil {
			writeErr(w, err, 0)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d)
	})
}

// Request is what a joining node sends.
type Request struct {
	TokenID string `json:"tokenId"`
	Secret  string `json:"secret"`
	// Name is the node's name, which its certificate carries.
	Name string `json:"name"`
	// CSR is a PEM certificate request for the node's key, for Name.
	CSR string `json:"csr"`
}

// Response is what the driver answers: the node's certificate and the cluster CA (PEM).
type Response struct {
	Certificate string `json:"certificate"`
	CA          string `json:"ca"`
	// GossipKey is the cluster's gossip key (base64), sent only inside the pinned TLS channel.
	GossipKey string `json:"gossipKey,omitempty"`
	// Gossip are gossip addresses (host:port) of the cluster's members the node can join
	// through, the driver's first.
	Gossip []string `json:"gossip,omitempty"`
}

// errRefused is the one answer for a token that is unknown, wrong, expired or used up: which of
// those it was would tell a guesser too much.
var errRefused = errdefs.Unauthorized("the join token is invalid, expired or used up")

// Join checks req's token, spends one of its uses and signs the node's certificate.
func (a *Authority) Join(ctx context.Context, req Request) (Response, error) {
	if !nameRe.MatchString(req.Name) {
		return Response{}, errdefs.InvalidArgument("node name %q must be a DNS label (lower-case letters, digits and -, at most 63)", req.Name)
	}
	block, _ := pem.Decode([]byte(req.CSR))
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return Response{}, errdefs.InvalidArgument("csr is not a PEM certificate request")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return Response{}, errdefs.InvalidArgument("csr: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return Response{}, errdefs.InvalidArgument("csr signature: %v", err)
	}
	if csr.Subject.CommonName != req.Name {
		return Response{}, errdefs.InvalidArgument("csr names %q, not the node %q", csr.Subject.CommonName, req.Name)
	}
	// The token is checked last, so a malformed request does not spend a use.
	ok, err := a.Tokens.UseJoinToken(ctx, req.TokenID, hashSecret(req.Secret), a.now())
	if err != nil {
		return Response{}, err
	}
	if !ok {
		return Response{}, errRefused
	}
	now := a.now()
	der, err := a.CA.Sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: req.Name, Organization: []string{nodeOrganization}},
		DNSNames:    []string{req.Name},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(CertValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}, csr.PublicKey)
	if err != nil {
		return Response{}, err
	}
	resp := Response{
		Certificate: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		CA:          string(a.CA.CertPEM),
		GossipKey:   base64.StdEncoding.EncodeToString(a.GossipKey),
	}
	if a.Gossip != nil {
		resp.Gossip = a.Gossip()
	}
	return resp, nil
}

// Driver returns credentials for the driver itself, for a fresh key: a certificate for hosts
// (names or IP addresses nodes reach it at) with both client and server use, not marked as a
// node's, so it can serve joins and call nodes.
func (a *Authority) Driver(name string, hosts []string) (Credentials, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Credentials{}, err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		NotBefore:   a.now().Add(-time.Hour),
		NotAfter:    a.now().Add(CertValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := a.CA.Sign(tmpl, &key.PublicKey)
	if err != nil {
		return Credentials{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Credentials{}, err
	}
	// The chain carries the CA: a joining node finds the CA its token pins in it.
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), a.CA.CertPEM...)
	return Credentials{KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		CertPEM: chain, CAPEM: a.CA.CertPEM, GossipKey: a.GossipKey}, nil
}

// ServeHTTP answers the join endpoint with E2B-style JSON errors ({"code","message"}).
func (a *Authority) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeErr(w, errdefs.InvalidArgument("use POST"), http.StatusMethodNotAllowed)
		return
	}
	var req Request
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req); err != nil {
		writeErr(w, errdefs.InvalidArgument("invalid join request: %v", err), 0)
		return
	}
	resp, err := a.Join(r.Context(), req)
	if err != nil {
		writeErr(w, err, 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func writeErr(w http.ResponseWriter, err error, status int) {
	if status == 0 {
		status = errdefs.HTTPStatus(err)
	}
	msg := "join failed"
	var e *errdefs.Error
	if errors.As(err, &e) {
		msg = e.Msg
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// Credentials are what a node keeps after it joined.
type Credentials struct {
	KeyPEM, CertPEM, CAPEM []byte
	GossipKey              []byte
	// Gossip are the addresses the join answer named to join the gossip through.
	Gossip []string `json:",omitempty"`
}

// Node joins the cluster at driverURL (https) with token as name: it makes a key, checks that
// the driver's certificate chains to the CA the token pins, and returns its credentials.
func Node(ctx context.Context, driverURL, token, name string) (Credentials, error) {
	t, err := ParseToken(token)
	if err != nil {
		return Credentials{}, err
	}
	u, err := url.Parse(driverURL)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" {
		return Credentials{}, errdefs.InvalidArgument("the driver's address must be https://HOST[:PORT], got %q", driverURL)
	}
	if t.Pin == "" {
		if t.Pin, err = discover(ctx, driverURL, t); err != nil {
			return Credentials{}, err
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Credentials{}, err
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
	if err != nil {
		return Credentials{}, fmt.Errorf("make a certificate request: %w", err)
	}
	body, _ := json.Marshal(Request{TokenID: t.ID, Secret: t.Secret, Name: name,
		CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}))})
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: pinnedConfig(t.Pin, u.Hostname())}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(driverURL, "/")+Path, strings.NewReader(string(body)))
	if err != nil {
		return Credentials{}, errdefs.InvalidArgument("driver address: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return Credentials{}, fmt.Errorf("join %s: %w", driverURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return Credentials{}, fmt.Errorf("join %s: %w", driverURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(b, &e)
		return Credentials{}, fmt.Errorf("join %s: %s: %s", driverURL, resp.Status, e.Message)
	}
	var out Response
	if err := json.Unmarshal(b, &out); err != nil {
		return Credentials{}, fmt.Errorf("join %s: %w", driverURL, err)
	}
	ca, err := parseCert([]byte(out.CA))
	if err != nil || tlsutil.PinOf(ca) != t.Pin {
		return Credentials{}, fmt.Errorf("join %s: the CA sent is not the one the token pins", driverURL)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Credentials{}, err
	}
	gossip, err := base64.StdEncoding.DecodeString(out.GossipKey)
	if err != nil {
		return Credentials{}, fmt.Errorf("join %s: gossip key: %w", driverURL, err)
	}
	return Credentials{KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		CertPEM: []byte(out.Certificate), CAPEM: []byte(out.CA), GossipKey: gossip, Gossip: out.Gossip}, nil
}

// discover asks the driver at driverURL for the cluster CA of a token written without a pin, checks
// the CA by the HMAC its answer carries (keyed by the token's secret, which is never sent), and
// returns the CA's pin. The channel is not verified: the HMAC is what the node trusts.
func discover(ctx context.Context, driverURL string, t Token) (string, error) {
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Nothing is known yet to verify the driver by; its answer is checked by the HMAC.
		InsecureSkipVerify: true, //nolint:gosec // the answer is verified by its HMAC
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(driverURL, "/")+DiscoveryPath+"?id="+url.QueryEscape(t.ID), nil)
	if err != nil {
		return "", errdefs.InvalidArgument("driver address: %v", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("discover the cluster CA at %s: %w", driverURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return "", fmt.Errorf("discover the cluster CA at %s: %w", driverURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("discover the cluster CA at %s: %s", driverURL, resp.Status)
	}
	var d Discovery
	if err := json.Unmarshal(b, &d); err != nil {
		return "", fmt.Errorf("discover the cluster CA at %s: %w", driverURL, err)
	}
	mac, err := base64.StdEncoding.DecodeString(d.MAC)
	ca, cerr := parseCert([]byte(d.CA))
	if err != nil || cerr != nil {
		return "", fmt.Errorf("discover the cluster CA at %s: a malformed answer", driverURL)
	}
	key := sha256.Sum256([]byte(t.Secret))
	if !hmac.Equal(mac, discoveryMAC(key[:], ca.Raw)) {
		return "", fmt.Errorf("discover the cluster CA at %s: the CA sent is not vouched for by the join token (a wrong secret, an unknown or used-up token, or not the cluster's driver)", driverURL)
	}
	if !ca.IsCA {
		return "", fmt.Errorf("discover the cluster CA at %s: the certificate sent is not a CA", driverURL)
	}
	return tlsutil.PinOf(ca), nil
}

// pinnedConfig trusts a server only if its chain holds a CA with the pinned key that signed a
// leaf for host, and that leaf is not a node's: before a node has the CA, the pin is all it knows
// of it, and another node (whose certificate the same CA signed) must not pose as the driver to
// take the token's secret.
func pinnedConfig(pin, host string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain is verified below against the pinned CA instead of system roots.
		InsecureSkipVerify: true, //nolint:gosec // verified by VerifyPeerCertificate
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			var certs []*x509.Certificate
			for _, r := range raw {
				c, err := x509.ParseCertificate(r)
				if err != nil {
					return err
				}
				certs = append(certs, c)
			}
			if len(certs) == 0 {
				return errors.New("the driver sent no certificate")
			}
			for _, c := range certs[1:] {
				if subtle.ConstantTimeCompare([]byte(tlsutil.PinOf(c)), []byte(pin)) != 1 || !c.IsCA {
					continue
				}
				roots := x509.NewCertPool()
				roots.AddCert(c)
				if slices.Contains(certs[0].Subject.Organization, nodeOrganization) {
					return errors.New("a node's certificate, not the driver's, answered the join")
				}
				if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err == nil {
					return nil
				}
			}
			return errors.New("the driver's certificate does not chain to the CA the join token pins")
		},
	}
}

func parseCert(p []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(p)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// MutualTLS is the configuration both ends use once a node joined: present creds' certificate,
// and accept only peers whose certificate the cluster CA signed. server says which end this is.
func MutualTLS(creds Credentials, server bool) (*tls.Config, error) {
	pair, err := tls.X509KeyPair(creds.CertPEM, creds.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("node credentials: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(creds.CAPEM) {
		return nil, errors.New("node credentials: no CA certificate")
	}
	c := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair}}
	if server {
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	} else {
		c.RootCAs = pool
	}
	return c, nil
}
