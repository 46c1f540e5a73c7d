package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/join"
)

func TestJoinTokenCommand(t *testing.T) {
	dir := t.TempDir()
	issue := func(args ...string) (string, error) {
		cmd := nodeCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"join-token", "--data-dir", dir}, args...))
		err := cmd.Execute()
		return strings.TrimSpace(out.String()), err
	}
	a, err := issue()
	if err != nil {
		t.Fatal(err)
	}
	b, err := issue("--uses", "3", "--ttl", "1h")
	if err != nil {
		t.Fatal(err)
	}
	ta, err := join.ParseToken(a)
	if err != nil {
		t.Fatalf("%q: %v", a, err)
	}
	tb, err := join.ParseToken(b)
	if err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	if ta.ID == tb.ID || ta.Secret == tb.Secret {
		t.Error("two tokens are the same")
	}
	if ta.Pin != tb.Pin {
		t.Error("the cluster CA changed between two tokens")
	}
	if _, err := issue("--ttl", "0s"); err == nil {
		t.Error("a token without a lifetime was issued")
	}
}
