package nodeapi

import (
	"errors"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
)

// reasonKey is the error metadata that carries what a Connect code cannot: the sentinels the
// driver matches with errors.Is, a kind without a code of its own, and E2B's error_code.
const (
	reasonKey = "Vmon-Error-Reason"
	codeKey   = "Vmon-Error-Code"
)

// Reasons.
const (
	reasonLost                = "sandbox-lost"
	reasonPaused              = "sandbox-paused"
	reasonNotImplemented      = "not-implemented"
	reasonInsufficientStorage = "insufficient-storage"
)

var kindCodes = map[errdefs.Kind]connect.Code{
	errdefs.KindInvalidArgument:     connect.CodeInvalidArgument,
	errdefs.KindNotFound:            connect.CodeNotFound,
	errdefs.KindConflict:            connect.CodeFailedPrecondition,
	errdefs.KindUnauthorized:        connect.CodeUnauthenticated,
	errdefs.KindForbidden:           connect.CodePermissionDenied,
	errdefs.KindUnavailable:         connect.CodeUnavailable,
	errdefs.KindResourceExhausted:   connect.CodeResourceExhausted,
	errdefs.KindDeadlineExceeded:    connect.CodeDeadlineExceeded,
	errdefs.KindDataLoss:            connect.CodeDataLoss,
	errdefs.KindInsufficientStorage: connect.CodeResourceExhausted,
}

// toWire turns a node's error into a Connect error: its kind as the code, its client-safe
// message as the message (the internal cause stays on the node, in its log), and a reason for
// what the driver must tell apart.
func toWire(err error) error {
	if err == nil {
		return nil
	}
	// An error without a kind is the node's own failure: the driver logs its text and shows
	// clients a generic message, so the whole text goes (driver and node are both the
	// operator's). A kinded one's client-safe message is what the driver needs.
	code := connect.CodeUnknown
	msg := err.Error()
	var e *errdefs.Error
	if errors.As(err, &e) {
		msg = e.Msg
		if c, ok := kindCodes[e.Kind]; ok {
			code = c
		}
	}
	reason := ""
	switch {
	case errors.Is(err, node.ErrSandboxLost):
		reason = reasonLost
	case errors.Is(err, node.ErrSandboxPaused):
		reason = reasonPaused
	case errors.Is(err, driver.ErrNotImplemented):
		reason, code, msg = reasonNotImplemented, connect.CodeUnimplemented, err.Error()
	case errdefs.KindOf(err) == errdefs.KindInsufficientStorage:
		reason = reasonInsufficientStorage
	}
	ce := connect.NewError(code, errors.New(msg))
	if reason != "" {
		ce.Meta().Set(reasonKey, reason)
	}
	if e != nil && e.Code != "" {
		ce.Meta().Set(codeKey, e.Code)
	}
	return ce
}

// fromWire turns a Connect error back into the error the node returned, as far as the driver can
// tell: the same kind, message, E2B error code and sentinel. Transport failures (the node cannot
// be reached) are Unavailable.
func fromWire(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return errdefs.Wrap(errdefs.KindUnavailable, err, "the node cannot be reached")
	}
	msg := ce.Message()
	reason := ce.Meta().Get(reasonKey)
	if reason == reasonNotImplemented {
		return notImplemented(msg)
	}
	kind := errdefs.KindUnknown
	switch {
	case reason == reasonInsufficientStorage:
		kind = errdefs.KindInsufficientStorage
	default:
		for k, c := range kindCodes {
			// ResourceExhausted's code is InsufficientStorage's too; the reason tells them apart.
			if c == ce.Code() && k != errdefs.KindInsufficientStorage {
				kind = k
			}
		}
	}
	if kind == errdefs.KindUnknown && reason == "" && ce.Code() != connect.CodeUnknown {
		// A code no node sends (the transport's own): the node could not be asked.
		return errdefs.Wrap(errdefs.KindUnavailable, err, "the node cannot be reached")
	}
	var sentinel error
	switch reason {
	case reasonLost:
		sentinel = node.ErrSandboxLost
	case reasonPaused:
		sentinel = node.ErrSandboxPaused
	}
	var out error
	switch {
	case sentinel != nil && kind == errdefs.KindUnknown:
		return &remoteError{msg: msg, sentinel: sentinel}
	case sentinel != nil:
		out = errdefs.Wrap(kind, sentinel, "%s", msg)
	case kind == errdefs.KindUnknown:
		return &remoteError{msg: msg}
	default:
		out = &errdefs.Error{Kind: kind, Msg: msg}
	}
	if code := ce.Meta().Get(codeKey); code != "" {
		out = errdefs.WithCode(out, code)
	}
	return out
}

// notImplemented keeps a remote node's 501 message as it was, and matches
// driver.ErrNotImplemented.
type notImplemented string

func (n notImplemented) Error() string      { return string(n) }
func (notImplemented) Is(target error) bool { return target == driver.ErrNotImplemented }

// remoteError is a node's error without a kind, with its text and the sentinel it wrapped.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }
