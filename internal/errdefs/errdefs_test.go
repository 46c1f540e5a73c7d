package errdefs

import (
	"strings"
	"testing"
)

func TestLongInputIsClipped(t *testing.T) {
	huge := strings.Repeat("a", 500_000)
	for _, err := range []error{
		NotFound("sandbox %q not found", huge),
		InvalidArgument("bad id %s", huge),
		Wrap(KindUnavailable, nil, "template %v is missing", huge),
	} {
		msg := PublicMessage(err)
		if len(msg) > 400 || !strings.Contains(msg, "(500000 bytes)") {
			t.Fatalf("message of %d bytes: %.120s", len(msg), msg)
		}
	}
	if got := PublicMessage(NotFound("sandbox %q not found", "abc")); got != `sandbox "abc" not found` {
		t.Fatalf("short input changed: %s", got)
	}
	if got := PublicMessage(NotFound("path '%s' does not exist", strings.Repeat("é", 200))); strings.ContainsRune(got, '\uFFFD') {
		t.Fatalf("a cut split a UTF-8 sequence: %q", got)
	}
	if got := Quote(huge); len(got) > 300 || !strings.HasSuffix(got, "(500000 bytes)") {
		t.Fatalf("Quote: %.100s", got)
	}
}
