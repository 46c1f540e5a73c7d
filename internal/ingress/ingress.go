// Package ingress routes client traffic to sandboxes: E2B's `E2b-Sandbox-Id`/`E2b-Sandbox-Port`
// headers and `<port>-<sandboxID>.<domain>` host names. Every byte reaches the guest through the
// node's agent channel (envd for port 49983, a CONNECT tunnel for any other port), never through
// the guest network. It owns routing, edge auth (traffic tokens, orchestrator-only envd paths)
// and E2B's 502 body; it never touches records or runtimes itself.
package ingress

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
)

// Target is one running sandbox as ingress needs it.
type Target struct {
	ID string
	// AccessToken is the envd access token; it binds signed file URLs to this sandbox.
	AccessToken string
	// TrafficToken, when set, must accompany every request to a non-envd port.
	TrafficToken string
	// MaskHost, when set, is the Host header requests to non-envd ports carry to the guest,
	// with ${PORT} replaced by the port (E2B's maskRequestHost).
	MaskHost string
	// Envd carries HTTP requests to the sandbox's envd.
	Envd http.RoundTripper
	// Dial opens a tunnel to a guest loopback port.
	Dial func(ctx context.Context, port int) (net.Conn, error)
}

// Sandboxes is what ingress needs from the node/driver.
type Sandboxes interface {
	// Target returns the running sandbox id, or an error if it is unknown or not running.
	Target(ctx context.Context, id string) (Target, error)
	// Targets lists running sandboxes, to resolve header-less signed file URLs.
	Targets(ctx context.Context) []Target
}

// Header names the SDK and users send.
const (
	HeaderSandboxID    = "E2b-Sandbox-Id"
	HeaderSandboxPort  = "E2b-Sandbox-Port"
	HeaderTrafficToken = "E2b-Traffic-Access-Token"
)

// CodeInterpreterPort is the guest port of the code-interpreter-v1 template's code-execution
// service, whose POST /execute needs the envd access token.
const CodeInterpreterPort = 49999

var sandboxIDRe = regexp.MustCompile(`^[a-z0-9]+$`)

// orchestratorOnly are envd paths only the node may call.
var orchestratorOnly = map[string]bool{
	"/init": true, "/freeze": true, "/unfreeze": true, "/fsfreeze": true, "/fsthaw": true,
	"/collapse": true, "/upgrade": true,
}

// Proxy is the ingress handler.
type Proxy struct {
	log       *slog.Logger
	sandboxes Sandboxes
	domain    string
	envd      *httputil.ReverseProxy
	ports     *httputil.ReverseProxy
}

type ctxKey struct{}

type route struct {
	target Target
	port   int
}

// New returns an ingress proxy. domain is the configured sandbox domain ("" disables host routing).
func New(log *slog.Logger, sandboxes Sandboxes, domain string) *Proxy {
	p := &Proxy{log: log, sandboxes: sandboxes, domain: strings.ToLower(domain)}
	errorHandler := func(w http.ResponseWriter, r *http.Request, err error) {
		rt := r.Context().Value(ctxKey{}).(*route)
		if errors.Is(err, context.Canceled) {
			return
		}
		log.Debug("ingress upstream failed", "sandbox", rt.target.ID, "port", rt.port, "err", err)
		writeNotFound(w, rt.target.ID)
	}
	rewrite := func(pr *httputil.ProxyRequest) {
		rt := pr.In.Context().Value(ctxKey{}).(*route)
		pr.Out.URL.Scheme = "http"
		pr.Out.URL.Host = agentproto.TunnelAuthority(rt.port)
		// Keep the client's Host: guest web servers and envd see what the client asked for,
		// unless the sandbox masks it for its own ports.
		pr.Out.Host = pr.In.Host
		if rt.target.MaskHost != "" && rt.port != agentproto.EnvdPort {
			pr.Out.Host = strings.ReplaceAll(rt.target.MaskHost, "${PORT}", strconv.Itoa(rt.port))
		}
		pr.SetXForwarded()
	}
	// A client that goes away mid-stream makes ReverseProxy log a copy error; that is routine.
	errorLog := slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	p.envd = &httputil.ReverseProxy{
		ErrorLog:      errorLog,
		Rewrite:       rewrite,
		Transport:     envdTransport{},
		FlushInterval: -1, // Connect server streams must reach the SDK message by message.
		ErrorHandler:  errorHandler,
	}
	p.ports = &httputil.ReverseProxy{
		ErrorLog: errorLog,
		Rewrite:  rewrite,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				rt := ctx.Value(ctxKey{}).(*route)
				return rt.target.Dial(ctx, rt.port)
			},
			// A pooled connection is a tunnel to one sandbox's port; never share it across routes.
			DisableKeepAlives:     true,
			ResponseHeaderTimeout: 0,
			DisableCompression:    true,
		},
		FlushInterval: -1,
		ErrorHandler:  errorHandler,
	}
	return p
}

// envdTransport sends each request over the routed sandbox's agent channel.
type envdTransport struct{}

func (envdTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rt := r.Context().Value(ctxKey{}).(*route)
	return rt.target.Envd.RoundTrip(r)
}

// Match reports whether r is addressed to a sandbox rather than to the API.
func (p *Proxy) Match(r *http.Request) bool {
	if r.Header.Get(HeaderSandboxID) != "" || r.Header.Get(HeaderSandboxPort) != "" {
		return true
	}
	if _, _, ok := p.parseHost(r.Host); ok {
		return true
	}
	// Header-less signed file URLs (downloadUrl/uploadUrl in header mode) carry only a signature.
	return r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" && !p.isAPIHost(r.Host)
}

func (p *Proxy) isAPIHost(host string) bool {
	h := hostOnly(host)
	return p.domain != "" && h == "api."+p.domain
}

func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.ToLower(host)
}

// parseHost splits "<port>-<sandboxID>.<domain>".
func (p *Proxy) parseHost(host string) (id string, port int, ok bool) {
	if p.domain == "" {
		return "", 0, false
	}
	h := hostOnly(host)
	label, rest, found := strings.Cut(h, ".")
	if !found || rest != p.domain {
		return "", 0, false
	}
	ps, id, found := strings.Cut(label, "-")
	if !found {
		return "", 0, false
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port <= 0 || port > 65535 || !sandboxIDRe.MatchString(id) {
		return "", 0, false
	}
	return id, port, true
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, err := p.address(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"code": http.StatusBadRequest, "message": err.Error()})
		return
	}
	var target Target
	if id == "" {
		t, why := p.bySignature(r)
		if why != "" {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": why})
			return
		}
		target, port = t, agentproto.EnvdPort
	} else {
		target, err = p.sandboxes.Target(r.Context(), id)
		if errdefs.Is(err, errdefs.KindUnavailable) {
			// There in a moment (recovering after a restart): not a sandbox the SDK may
			// take for gone.
			w.Header().Set("Retry-After", "2")
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{
				"sandboxId": id, "message": err.Error(), "code": http.StatusServiceUnavailable,
			})
			return
		}
		if err != nil {
			writeNotFound(w, id)
			return
		}
	}
	if r.Method == http.MethodConnect {
		writeJSON(w, http.StatusMethodNotAllowed, map[string]any{"code": http.StatusMethodNotAllowed, "message": "CONNECT is not supported"})
		return
	}
	rt := &route{target: target, port: port}
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, rt))
	// The guest may answer before the upstream transport has finished with the client's body
	// (read its EOF). Left half-duplex, net/http consumes and closes that body when the response
	// starts, the transport's last read fails and it drops the guest connection mid-response,
	// which the guest sees as its client leaving. HTTP/2 is always full duplex (ErrNotSupported).
	_ = http.NewResponseController(w).EnableFullDuplex()
	if port == agentproto.EnvdPort {
		if orchestratorOnly[r.URL.Path] {
			writeJSON(w, http.StatusForbidden, map[string]any{"code": http.StatusForbidden, "message": "this envd endpoint is not reachable through ingress"})
			return
		}
		if err := bufferRPCBody(r); err != nil {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]any{"code": http.StatusRequestEntityTooLarge, "message": err.Error()})
			return
		}
		p.envd.ServeHTTP(w, r)
		return
	}
	if target.TrafficToken != "" {
		got := r.Header.Get(HeaderTrafficToken)
		if subtle.ConstantTimeCompare([]byte(got), []byte(target.TrafficToken)) != 1 {
			writeJSON(w, http.StatusForbidden, map[string]any{"sandboxId": id, "code": http.StatusForbidden,
				"message": "missing or invalid traffic access token"})
			return
		}
		// The token is for the edge; the guest service never sees it.
		r.Header.Del(HeaderTrafficToken)
	}
	if port == CodeInterpreterPort && r.Method == http.MethodPost && r.URL.Path == "/execute" && target.AccessToken != "" {
		// E2B's code-execution service runs code only for whoever holds the sandbox's envd access
		// token, which @e2b/code-interpreter sends on /execute alone; a sandbox id is no secret.
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(target.AccessToken)) != 1 {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"sandboxId": id, "code": http.StatusUnauthorized,
				"message": "running code needs the sandbox's access token (X-Access-Token)"})
			return
		}
	}
	p.ports.ServeHTTP(w, r)
}

// maxRPCBody bounds the envd request bodies ingress reads ahead (Connect messages are small;
// envd's own largest, stdin input, is far below this).
const maxRPCBody = 8 << 20

// bufferRPCBody reads a Connect request's body in full before it is proxied, bounding it (envd
// reads these whole anyway). It also made envd's server streams immune to the half-duplex race
// (see EnableFullDuplex in ServeHTTP) before that was fixed at its cause. /files uploads stream:
// envd answers them only after reading the whole body.
func bufferRPCBody(r *http.Request) error {
	if r.Body == nil || r.Body == http.NoBody || r.URL.Path == "/files" {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRPCBody+1))
	_ = r.Body.Close()
	if err != nil {
		return fmt.Errorf("read request body: %w", err)
	}
	if len(body) > maxRPCBody {
		return fmt.Errorf("request body over %d bytes", maxRPCBody)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Del("Transfer-Encoding")
	r.TransferEncoding = nil
	return nil
}

// address finds the sandbox id and port a request is for; "" id means "find it by signature".
func (p *Proxy) address(r *http.Request) (string, int, error) {
	hid, hport := r.Header.Get(HeaderSandboxID), r.Header.Get(HeaderSandboxPort)
	if hid != "" || hport != "" {
		if hid == "" || hport == "" {
			return "", 0, errors.New("both E2b-Sandbox-Id and E2b-Sandbox-Port headers are required")
		}
		if !sandboxIDRe.MatchString(hid) {
			return "", 0, errors.New("invalid sandbox id")
		}
		port, err := strconv.Atoi(hport)
		if err != nil || port <= 0 || port > 65535 {
			return "", 0, errors.New("invalid sandbox port")
		}
		return hid, port, nil
	}
	if id, port, ok := p.parseHost(r.Host); ok {
		return id, port, nil
	}
	return "", 0, nil
}

// bySignature finds the running sandbox whose access token validates the URL's signature.
func (p *Proxy) bySignature(r *http.Request) (Target, string) {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return Target{}, "invalid signature"
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	var exp int64
	if s := q.Get("signature_expiration"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Target{}, "invalid signature"
		}
		exp = v
	}
	for _, t := range p.sandboxes.Targets(r.Context()) {
		if t.AccessToken == "" {
			continue
		}
		want := agentproto.FileSignature(q.Get("path"), op, q.Get("username"), t.AccessToken, exp)
		if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) == 1 {
			// Checked once the signature identified the sandbox, so the reason is not lost (as
			// envd answers in domain mode).
			if exp != 0 && exp < time.Now().Unix() {
				return Target{}, "signature is already expired"
			}
			return t, ""
		}
	}
	return Target{}, "invalid signature"
}

// writeNotFound writes E2B's edge body for unknown, stopped or unreachable sandboxes; the SDK
// relies on the 502 to tell that a sandbox is gone.
func writeNotFound(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{
		"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway,
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
