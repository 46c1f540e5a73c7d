package ingress

import (
	"encoding/binary"
	"net/http"
	"strings"
)

// endStreamWriter holds back the flush of a Connect stream's final EndStream envelope, so the
// envelope and the end of the HTTP/1.1 response (the last chunk) leave in one write (see
// connectStreamWriter for why). It is not safe for concurrent use.
type endStreamWriter struct {
	http.ResponseWriter
	// The envelope parser's state: bytes of the current 5-byte prefix seen, its flags, and
	// payload bytes still to come.
	prefix    [5]byte
	prefixLen int
	remaining uint32
	// lastEnd is true while the stream sits right after a complete EndStream envelope.
	lastEnd bool
}

const connectEndStreamFlag = 0x02

func isConnectStream(contentType string) bool {
	return strings.HasPrefix(contentType, "application/connect+")
}

func (w *endStreamWriter) Write(b []byte) (int, error) {
	w.scan(b)
	return w.ResponseWriter.Write(b)
}

// scan advances the envelope state machine over b.
func (w *endStreamWriter) scan(b []byte) {
	for len(b) > 0 {
		if w.remaining > 0 {
			n := min(uint32(len(b)), w.remaining)
			w.remaining -= n
			b = b[n:]
			if w.remaining == 0 {
				w.lastEnd = w.prefix[0]&connectEndStreamFlag != 0
			}
			continue
		}
		w.lastEnd = false
		n := copy(w.prefix[w.prefixLen:], b)
		w.prefixLen += n
		b = b[n:]
		if w.prefixLen == len(w.prefix) {
			w.prefixLen = 0
			w.remaining = binary.BigEndian.Uint32(w.prefix[1:])
			if w.remaining == 0 {
				w.lastEnd = w.prefix[0]&connectEndStreamFlag != 0
			}
		}
	}
}

// Flush passes through except right after the EndStream envelope, whose bytes then go out with
// the response's end when the handler returns.
func (w *endStreamWriter) Flush() {
	if w.lastEnd {
		return
	}
	flush(w.ResponseWriter)
}

func (w *endStreamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
