package server

import (
	"mime"
	"net/textproto"
	"strings"
)

// formPart returns the form field name and the filename of a multipart part, keeping the
// filename's directories. mime/multipart's Part.FileName() applies filepath.Base, but the SDK
// sends the target path ("/tmp/a.txt", "b/b.txt") as the filename.
func formPart(h textproto.MIMEHeader) (name, filename string) {
	cd := h.Get("Content-Disposition")
	if cd == "" {
		return "", ""
	}
	if _, params, err := mime.ParseMediaType(cd); err == nil {
		return params["name"], params["filename"]
	}
	// ParseMediaType rejects some headers browsers produce (e.g. duplicate parameters); fall back
	// to a lenient scan of the parameters.
	return dispositionParam(cd, "name"), dispositionParam(cd, "filename")
}

// dispositionParam finds key=value or key="value" among the ;-separated parameters of cd.
func dispositionParam(cd, key string) string {
	rest := cd
	for rest != "" {
		i := strings.IndexByte(rest, ';')
		if i < 0 {
			return ""
		}
		rest = strings.TrimLeft(rest[i+1:], " \t")
		k, v, ok := strings.Cut(rest, "=")
		if !ok {
			return ""
		}
		k = strings.TrimSpace(k)
		var val string
		if strings.HasPrefix(v, `"`) {
			// Quoted string: honour backslash escapes up to the closing quote.
			var b strings.Builder
			j := 1
			for ; j < len(v) && v[j] != '"'; j++ {
				if v[j] == '\\' && j+1 < len(v) {
					j++
				}
				b.WriteByte(v[j])
			}
			val = b.String()
			rest = v[min(j+1, len(v)):]
		} else {
			end := strings.IndexByte(v, ';')
			if end < 0 {
				end = len(v)
			}
			val = strings.TrimSpace(v[:end])
			rest = v[end:]
		}
		if strings.EqualFold(k, key) {
			return val
		}
	}
	return ""
}
