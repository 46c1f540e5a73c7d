// Package errdefs defines the error kinds shared by every layer of vmon.
//
// A kind is attached where an error starts (errdefs.NotFound("sandbox %q", id)) and read once at
// each edge: the REST API maps it to an HTTP status and E2B's error body, envd maps it to a Connect
// code. The user-facing message is kept apart from the wrapped cause so that host paths and
// internal addresses never reach a client. This package imports nothing of vmon.
package errdefs

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// Kind classifies an error for the edges.
type Kind int

const (
	KindUnknown Kind = iota
	KindInvalidArgument
	KindNotFound
	KindConflict
	KindUnauthorized
	KindForbidden
	KindUnavailable
	KindResourceExhausted
	KindDeadlineExceeded
	// KindDataLoss: stored state (a snapshot) is damaged; the operation was refused before it
	// could use it.
	KindDataLoss
	// KindInsufficientStorage: the node's storage budget (e.g. for snapshots) is used up.
	KindInsufficientStorage
)

// Error carries a kind, a message safe to show to a client, and an optional internal cause.
type Error struct {
	Kind Kind
	// Msg is shown to clients; it must never include host paths or internal addresses.
	Msg string
	// Code is an optional machine-readable error code (E2B's "error_code").
	Code  string
	Cause error
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return e.Msg + ": " + e.Cause.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Cause }

func newf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: sprintf(format, args...)}
}

// sprintf formats a client-safe message. String arguments are client input more often than not
// (ids, names, paths), so long ones are cut to a prefix: a 500 KB id never comes back as a
// 500 KB error body, whichever message quotes it.
func sprintf(format string, args ...any) string {
	for i, a := range args {
		if s, ok := a.(string); ok && len(s) > quoteLimit {
			args[i] = clipped(s)
		}
	}
	return fmt.Sprintf(format, args...)
}

// Clip returns s, or its first bytes and its length when it is long: for messages built without
// this package's constructors.
func Clip(s string) string {
	if len(s) <= quoteLimit {
		return s
	}
	return fmt.Sprint(clipped(s))
}

// clipped formats as the first quoteLimit bytes of a long string and its full length.
type clipped string

func (c clipped) Format(f fmt.State, verb rune) {
	s := string(c)
	cut := quoteLimit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if verb == 'q' {
		fmt.Fprintf(f, "%q… (%d bytes)", s[:cut], len(s))
		return
	}
	fmt.Fprintf(f, "%s… (%d bytes)", s[:cut], len(s))
}

func InvalidArgument(format string, args ...any) error {
	return newf(KindInvalidArgument, format, args...)
}
func NotFound(format string, args ...any) error     { return newf(KindNotFound, format, args...) }
func Conflict(format string, args ...any) error     { return newf(KindConflict, format, args...) }
func Unauthorized(format string, args ...any) error { return newf(KindUnauthorized, format, args...) }
func Forbidden(format string, args ...any) error    { return newf(KindForbidden, format, args...) }
func Unavailable(format string, args ...any) error  { return newf(KindUnavailable, format, args...) }
func DataLoss(format string, args ...any) error     { return newf(KindDataLoss, format, args...) }
func InsufficientStorage(format string, args ...any) error {
	return newf(KindInsufficientStorage, format, args...)
}
func ResourceExhausted(format string, args ...any) error {
	return newf(KindResourceExhausted, format, args...)
}

// WithCode sets E2B's machine-readable error_code on a kinded error.
func WithCode(err error, code string) error {
	var e *Error
	if errors.As(err, &e) {
		c := *e
		c.Code = code
		return &c
	}
	return err
}

// Wrap attaches a kind and a client-safe message to an internal cause.
func Wrap(k Kind, cause error, format string, args ...any) error {
	return &Error{Kind: k, Msg: sprintf(format, args...), Cause: cause}
}

// KindOf returns the kind of the first kinded error in err's chain.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindUnknown
}

// Is reports whether err has kind k.
func Is(err error, k Kind) bool { return err != nil && KindOf(err) == k }

// PublicMessage returns the client-safe text of err; unkinded errors get a generic text.
func PublicMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Msg
	}
	return "internal error"
}

// CodeOf returns E2B's error_code of err, if any.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// HTTPStatus maps a kind to the HTTP status the E2B SDK expects.
func HTTPStatus(err error) int {
	switch KindOf(err) {
	case KindInvalidArgument:
		return http.StatusBadRequest
	case KindNotFound:
		return http.StatusNotFound
	case KindConflict:
		return http.StatusConflict
	case KindUnauthorized:
		return http.StatusUnauthorized
	case KindForbidden:
		return http.StatusForbidden
	case KindUnavailable:
		return http.StatusServiceUnavailable
	case KindResourceExhausted:
		return http.StatusTooManyRequests
	case KindDeadlineExceeded:
		return http.StatusGatewayTimeout
	case KindInsufficientStorage:
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}

// quoteLimit is how much of a client's input an error message quotes: enough for any real path
// or name, far less than what a hostile client can send.
const quoteLimit = 256

// Quote renders client input for an error message: quoted, and cut to a short prefix, so a huge
// input (a 500 KB id) never comes back as a huge error body.
func Quote(s string) string {
	if len(s) <= quoteLimit {
		return strconv.Quote(s)
	}
	cut := quoteLimit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}
