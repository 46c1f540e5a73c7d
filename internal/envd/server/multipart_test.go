package server

import (
	"net/http"
	"net/textproto"
	"testing"
)

func TestFormPart(t *testing.T) {
	for _, tc := range []struct {
		cd, name, filename string
	}{
		{`form-data; name="file"; filename="/tmp/a.txt"`, "file", "/tmp/a.txt"},
		{`form-data; name="file"; filename="b/b.txt"`, "file", "b/b.txt"},
		{`form-data; name=file; filename=plain.txt`, "file", "plain.txt"},
		{`form-data; name="file"; filename="dir with space/q\"uote.txt"`, "file", `dir with space/q"uote.txt`},
		{`form-data; name="file"; filename*=UTF-8''%C3%A4%2Fx.txt`, "file", "ä/x.txt"},
		{`form-data; name="other"; filename="/tmp/x"`, "other", "/tmp/x"},
		// Duplicate parameters make mime.ParseMediaType fail; the lenient parser still finds them.
		{`form-data; name="file"; name="file"; filename="/srv/dup.txt"`, "file", "/srv/dup.txt"},
		{`form-data; name="file"`, "file", ""},
		{``, "", ""},
	} {
		h := textproto.MIMEHeader{}
		if tc.cd != "" {
			h.Set("Content-Disposition", tc.cd)
		}
		name, filename := formPart(h)
		if name != tc.name || filename != tc.filename {
			t.Errorf("formPart(%s) = %q, %q; want %q, %q", tc.cd, name, filename, tc.name, tc.filename)
		}
	}
}

func TestParseMetadata(t *testing.T) {
	h := http.Header{}
	h.Set("X-Metadata-Owner", "alice")
	h.Set("x-metadata-Build-Id", "42")
	h.Set("Content-Type", "text/plain")
	md, err := parseMetadata(h)
	if err != nil {
		t.Fatal(err)
	}
	if len(md) != 2 || md["owner"] != "alice" || md["build-id"] != "42" {
		t.Fatalf("metadata = %v", md)
	}
	bad := http.Header{}
	bad.Set("X-Metadata-Key", "caf\u00e9")
	if _, err := parseMetadata(bad); err == nil {
		t.Fatal("non-ASCII metadata value accepted")
	}
}
