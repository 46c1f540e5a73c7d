package oci

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"syscall"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/vibemon/vmon/internal/errdefs"
)

// classify turns a ggcr or network error into a kinded error whose message names only the
// reference the client gave: registry hosts may be internal mirrors, so they stay in the cause.
func classify(ctx context.Context, err error, ref string) error {
	if err == nil {
		return nil
	}
	var kinded *errdefs.Error
	if errors.As(err, &kinded) {
		return err
	}

	var terr *transport.Error
	if errors.As(err, &terr) {
		// Error codes are more precise than statuses: some registries answer 401 for a
		// repository that does not exist, but then say NAME_UNKNOWN.
		for _, d := range terr.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return errdefs.Wrap(errdefs.KindNotFound, err, "image %q not found", ref)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return unauthorized(err, ref)
			case transport.TooManyRequestsErrorCode:
				return errdefs.Wrap(errdefs.KindUnavailable, err, "registry for %q is rate limiting pulls", ref)
			}
		}
		switch sc := terr.StatusCode; {
		case sc == http.StatusNotFound:
			return errdefs.Wrap(errdefs.KindNotFound, err, "image %q not found", ref)
		case sc == http.StatusUnauthorized || sc == http.StatusForbidden:
			return unauthorized(err, ref)
		case sc == http.StatusTooManyRequests:
			return errdefs.Wrap(errdefs.KindUnavailable, err, "registry for %q is rate limiting pulls", ref)
		case sc >= 500:
			return errdefs.Wrap(errdefs.KindUnavailable, err, "registry for %q failed (HTTP %d)", ref, sc)
		}
		return errdefs.Wrap(errdefs.KindUnknown, err, "registry error pulling %q", ref)
	}

	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errdefs.Wrap(errdefs.KindDeadlineExceeded, err, "timed out pulling %q", ref)
	}
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return fmt.Errorf("pulling %q: %w", ref, err)
	}

	if isNetworkError(err) {
		return errdefs.Wrap(errdefs.KindUnavailable, err, "registry for %q is unreachable", ref)
	}
	return fmt.Errorf("pulling %q: %w", ref, err)
}

func unauthorized(err error, ref string) error {
	return errdefs.Wrap(errdefs.KindUnauthorized, err,
		"registry refused the credentials for %q (missing, wrong, or without pull access)", ref)
}

// isNetworkError reports failures to reach a registry at all, as opposed to answers from it.
func isNetworkError(err error) bool {
	var (
		dnsErr   *net.DNSError
		opErr    *net.OpError
		urlErr   *url.Error
		recErr   tls.RecordHeaderError
		certErr  *tls.CertificateVerificationError
		authErr  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalErr x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &dnsErr), errors.As(err, &opErr),
		errors.As(err, &recErr), errors.As(err, &certErr),
		errors.As(err, &authErr), errors.As(err, &hostErr), errors.As(err, &invalErr):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.ETIMEDOUT):
		return true
	case errors.As(err, &urlErr):
		// Everything net/http's client fails with is a *url.Error, including untyped ones such
		// as "server gave HTTP response to HTTPS client"; registry answers were handled above.
		return true
	}
	return false
}
