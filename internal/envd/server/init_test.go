package server

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/vibemon/vmon/internal/guestnet"
)

// The node's address push: applied only after the token check, validated before anything
// changes, a failure leaves the rest of /init unapplied and says why, and an envd that does not
// configure networks refuses rather than pretending.
func TestInitNetwork(t *testing.T) {
	var applied []guestnet.Config
	fail := false
	s, err := New(Options{ConfigureNetwork: func(c guestnet.Config) error {
		if fail {
			return errors.New("netlink says no")
		}
		applied = append(applied, c)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	do := func(token, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/init", bytes.NewBufferString(body))
		if token != "" {
			r.Header.Set("X-Access-Token", token)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w
	}
	const net1 = `"vmonNetwork":{"interface":"eth0","address":"172.20.0.2/30","gateway":"172.20.0.1"}`
	want := guestnet.Config{Interface: "eth0", Address: netip.MustParsePrefix("172.20.0.2/30"), Gateway: netip.MustParseAddr("172.20.0.1")}

	for _, bad := range []string{
		`{"vmonNetwork":{"interface":"eth0","address":"172.20.0.2/30","gateway":"10.0.0.1"}}`,
		`{"vmonNetwork":{"interface":"","address":"172.20.0.2/30","gateway":"172.20.0.1"}}`,
		`{"vmonNetwork":{"interface":"eth0","address":"banana","gateway":"172.20.0.1"}}`,
	} {
		if w := do("", bad); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, w.Code, w.Body)
		}
	}
	if len(applied) != 0 {
		t.Fatalf("an invalid push was applied: %+v", applied)
	}

	fail = true
	w := do("", `{"accessToken":"tok1",`+net1+`}`)
	if w.Code != http.StatusInternalServerError || !bytes.Contains(w.Body.Bytes(), []byte("netlink says no")) {
		t.Fatalf("failed push: %d %s", w.Code, w.Body)
	}
	if s.token != "" {
		t.Fatal("a failed push still set the access token")
	}
	fail = false
	if w := do("", `{"accessToken":"tok1",`+net1+`}`); w.Code != http.StatusNoContent {
		t.Fatalf("push: %d %s", w.Code, w.Body)
	}
	if len(applied) != 1 || applied[0] != want {
		t.Fatalf("applied %+v, want [%+v]", applied, want)
	}
	// Once a token is set, nobody without it reconfigures the network.
	if w := do("", `{`+net1+`}`); w.Code != http.StatusUnauthorized || len(applied) != 1 {
		t.Fatalf("push without the token: %d, %d applied", w.Code, len(applied))
	}
	if w := do("tok1", `{`+net1+`}`); w.Code != http.StatusNoContent || len(applied) != 2 {
		t.Fatalf("push with the token: %d, %d applied", w.Code, len(applied))
	}

	// An interface the guest does not have is a verdict, not a hiccup: 400, so the node stops.
	missing, err := New(Options{ConfigureNetwork: func(c guestnet.Config) error {
		return fmt.Errorf("find interface %s: %w", c.Interface, guestnet.ErrNoInterface)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = missing.Close() })
	r0 := httptest.NewRequest("POST", "/init", bytes.NewBufferString(`{`+net1+`}`))
	w0 := httptest.NewRecorder()
	missing.ServeHTTP(w0, r0)
	if w0.Code != http.StatusBadRequest || !bytes.Contains(w0.Body.Bytes(), []byte("no such interface")) {
		t.Fatalf("missing interface: %d %s", w0.Code, w0.Body)
	}

	plain := newTestServer(t, "")
	r := httptest.NewRequest("POST", "/init", bytes.NewBufferString(`{`+net1+`}`))
	rec := httptest.NewRecorder()
	plain.ServeHTTP(rec, r)
	if rec.Code != http.StatusBadRequest || !bytes.Contains(rec.Body.Bytes(), []byte("does not configure the guest network")) {
		t.Fatalf("envd without ConfigureNetwork: %d %s", rec.Code, rec.Body)
	}
}
