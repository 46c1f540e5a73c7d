package httpguard

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// Body pacing: a request body must keep arriving. ReadHeaderTimeout bounds only the header
// section, so without this a client trickling a byte every few seconds holds a connection and a
// handler goroutine for as long as it likes, and a thousand such clients hold a thousand.
const (
	// BodyGrace is how long any body may take before pacing starts to bind: small bodies on a
	// slow link are never cut.
	BodyGrace = 10 * time.Second
	// BodyMinRate is the average rate, in bytes per second, a body must keep up after the grace.
	// Real uploads run orders of magnitude faster; a trickle falls behind at once.
	BodyMinRate = 4 << 10
)

// SlowBodyError is the error a paced body's Read returns once the client fell behind.
type SlowBodyError struct {
	Read    int64
	Elapsed time.Duration
}

func (e *SlowBodyError) Error() string {
	return fmt.Sprintf("request body arrived too slowly: %d bytes in %s (at least %d bytes/s after the first %s)",
		e.Read, e.Elapsed.Round(time.Millisecond), BodyMinRate, BodyGrace)
}

// PaceBody replaces r.Body with one whose reads fail with *SlowBodyError once the body falls
// behind grace + read/minRate since the request began, enforced with the connection's read
// deadline so a stalled read ends too. The deadline is cleared at the body's end (net/http then
// reads the connection in the background to notice a client going away, and a stale deadline
// would cancel the request).
func PaceBody(w http.ResponseWriter, r *http.Request, grace time.Duration, minRate int64) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	r.Body = &pacedBody{rc: r.Body, ctl: http.NewResponseController(w), start: time.Now(), grace: grace, rate: minRate}
}

type pacedBody struct {
	rc    io.ReadCloser
	ctl   *http.ResponseController
	start time.Time
	grace time.Duration
	rate  int64
	n     int64
	done  bool
}

func (b *pacedBody) Read(p []byte) (int, error) {
	if b.done {
		return b.rc.Read(p)
	}
	allowed := b.grace + time.Duration(float64(b.n)/float64(b.rate)*float64(time.Second))
	if err := b.ctl.SetReadDeadline(b.start.Add(allowed)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return 0, err
	}
	n, err := b.rc.Read(p)
	b.n += int64(n)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrDeadlineExceeded):
		return n, &SlowBodyError{Read: b.n, Elapsed: time.Since(b.start)}
	default:
		b.finish()
	}
	return n, err
}

func (b *pacedBody) Close() error {
	b.finish()
	return b.rc.Close()
}

func (b *pacedBody) finish() {
	if !b.done {
		b.done = true
		_ = b.ctl.SetReadDeadline(time.Time{})
	}
}
