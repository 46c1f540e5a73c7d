package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/httpguard"
)

// errorBody is E2B's error shape. The SDK branches on the JSON `code`, so every error response,
// including 404s, must carry it.
type errorBody struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	ErrorCode string `json:"error_code,omitempty"`
}

// httpError is an edge-only error with an explicit status, for statuses errdefs has no kind for
// (413, 501) and for auth/routing answers produced here.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// errorResponse is the one mapping from errors to HTTP status and E2B's body. Messages come from
// errdefs' client-safe text, never from wrapped causes.
func errorResponse(err error) (int, errorBody) {
	var (
		he   *httpError
		mbe  *http.MaxBytesError
		slow *httpguard.SlowBodyError
	)
	switch {
	case errors.As(err, &he):
		return he.status, errorBody{Code: he.status, Message: he.msg}
	case errors.As(err, &slow):
		return http.StatusRequestTimeout, errorBody{Code: http.StatusRequestTimeout, Message: slow.Error()}
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, errorBody{Code: http.StatusRequestEntityTooLarge,
			Message: fmt.Sprintf("request body exceeds the limit of %d bytes", mbe.Limit)}
	case errors.Is(err, driver.ErrNotImplemented):
		// The driver builds these messages from fixed feature names only.
		return http.StatusNotImplemented, errorBody{Code: http.StatusNotImplemented, Message: err.Error()}
	case errdefs.KindOf(err) == errdefs.KindUnknown && errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, errorBody{Code: http.StatusGatewayTimeout, Message: "request timed out"}
	case errdefs.KindOf(err) == errdefs.KindUnknown && errors.Is(err, context.Canceled):
		// The client is gone; the status only shows in our logs.
		return 499, errorBody{Code: 499, Message: "request canceled"}
	}
	status := errdefs.HTTPStatus(err)
	return status, errorBody{Code: status, Message: errdefs.PublicMessage(err), ErrorCode: errdefs.CodeOf(err)}
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, body := errorResponse(err)
	if status >= 500 && status != http.StatusNotImplemented {
		s.log.Error("api request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only reachable with an unencodable type: a programming error.
		status, b = http.StatusInternalServerError, []byte(`{"code":500,"message":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// decodeBody decodes a JSON object body into dst. Unknown fields are ignored (newer SDKs send
// more); malformed JSON and wrong types are InvalidArgument errors naming the problem. An empty
// body is an error only when required.
func decodeBody(r *http.Request, dst any, required bool) error {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		var (
			mbe  *http.MaxBytesError
			slow *httpguard.SlowBodyError
		)
		if errors.As(err, &mbe) || errors.As(err, &slow) {
			return err
		}
		return errdefs.Wrap(errdefs.KindInvalidArgument, err, "failed to read request body")
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		if required {
			return errdefs.InvalidArgument("request body is required")
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(dst); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errdefs.InvalidArgument("malformed JSON: unexpected data after the JSON object")
	}
	return nil
}

func jsonError(err error) error {
	var (
		se *json.SyntaxError
		te *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &se):
		return errdefs.InvalidArgument("malformed JSON at byte %d: %s", se.Offset, se.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.InvalidArgument("malformed JSON: unexpected end of input")
	case errors.As(err, &te):
		if te.Field == "" {
			return errdefs.InvalidArgument("request body must be a JSON object, got %s", te.Value)
		}
		return errdefs.InvalidArgument("invalid value for %q: expected %s, got %s", te.Field, jsonType(te.Type), te.Value)
	default:
		return errdefs.InvalidArgument("invalid JSON: %s", err.Error())
	}
}

// jsonType names a Go type the way a JSON client thinks of it.
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array of " + strings.TrimPrefix(strings.TrimPrefix(jsonType(t.Elem()), "a "), "an ") + "s"
	case reflect.Map:
		return "an object of " + strings.TrimPrefix(strings.TrimPrefix(jsonType(t.Elem()), "a "), "an ") + "s"
	default:
		return "an object"
	}
}
