// Package rpcerr is envd's one place where error kinds (internal/errdefs) become Connect codes.
// The process and filesystem services return errdefs errors from their helpers and convert them
// here, at the RPC edge, so the SDK sees the codes it maps to its own error classes.
package rpcerr

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/errdefs"
)

// From converts err to a *connect.Error. Errors that already are Connect errors pass through;
// kinded errors get their code and public message; context errors keep their meaning.
func From(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	}
	code := connect.CodeInternal
	switch errdefs.KindOf(err) {
	case errdefs.KindInvalidArgument:
		code = connect.CodeInvalidArgument
	case errdefs.KindNotFound:
		code = connect.CodeNotFound
	case errdefs.KindConflict:
		code = connect.CodeFailedPrecondition
	case errdefs.KindUnauthorized:
		code = connect.CodeUnauthenticated
	case errdefs.KindForbidden:
		code = connect.CodePermissionDenied
	case errdefs.KindUnavailable:
		code = connect.CodeUnavailable
	case errdefs.KindResourceExhausted:
		code = connect.CodeResourceExhausted
	case errdefs.KindDeadlineExceeded:
		code = connect.CodeDeadlineExceeded
	case errdefs.KindUnknown:
		// Unkinded errors may carry internal detail; the message is still useful inside the
		// sandbox (the caller owns it), so keep the text.
		return connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewError(code, errors.New(errdefs.PublicMessage(err)))
}
