package server_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/envd/server"
)

// The node's memory hint reaches the out-of-memory killer; a malformed one is refused.
func TestMemoryHint(t *testing.T) {
	var got []bool
	srv, err := server.New(server.Options{MemoryHint: func(near bool) { got = append(got, near) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	post := func(body string) int {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest(http.MethodPost, agentproto.MemoryHintPath, strings.NewReader(body)))
		return w.Code
	}
	if code := post(`{"near":false}`); code != http.StatusNoContent {
		t.Fatalf("far: %d", code)
	}
	if code := post(`{"near":true}`); code != http.StatusNoContent {
		t.Fatalf("near: %d", code)
	}
	if code := post(`{"near":`); code != http.StatusBadRequest {
		t.Fatalf("malformed: %d", code)
	}
	if len(got) != 2 || got[0] || !got[1] {
		t.Fatalf("hints passed on: %v", got)
	}
}
