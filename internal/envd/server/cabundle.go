package server

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vibemon/vmon/internal/errdefs"
)

// TrustBundles are the guest trust stores /init's caBundle is appended to (seed 000, "HTTPS
// header rules"): Debian/Ubuntu/Alpine, Fedora/RHEL, and the two names other distributions and
// OpenSSL builds use. Whichever exist get it; when none does, the first is created.
var TrustBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/cert.pem",
	"/etc/ssl/ca-bundle.pem",
}

// maxCABundle bounds /init's caBundle: a node's CA is one certificate.
const maxCABundle = 64 << 10

// checkCABundle accepts PEM holding certificates and nothing else.
func checkCABundle(b []byte) error {
	if len(b) > maxCABundle {
		return errdefs.InvalidArgument("caBundle is larger than %d bytes", maxCABundle)
	}
	rest, n := b, 0
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return errdefs.InvalidArgument("caBundle holds a %q block; only certificates are accepted", blk.Type)
		}
		n++
	}
	if n == 0 {
		return errdefs.InvalidArgument("caBundle holds no PEM certificate")
	}
	return nil
}

// installCABundle appends bundle to every existing trust store in paths that does not hold it
// yet (so repeated /init calls, after every resume, add it once), or creates the first.
func installCABundle(paths []string, bundle []byte) error {
	bundle = bytes.TrimSpace(bundle)
	found := false
	var errs []error
	for _, p := range paths {
		cur, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		found = true
		if bytes.Contains(cur, bundle) {
			continue
		}
		if err := appendFile(p, cur, bundle); err != nil {
			errs = append(errs, fmt.Errorf("append the CA bundle to %s: %w", p, err))
		}
	}
	if !found && len(paths) > 0 {
		if err := os.MkdirAll(filepath.Dir(paths[0]), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", filepath.Dir(paths[0]), err)
		}
		if err := os.WriteFile(paths[0], append(bundle, '\n'), 0o644); err != nil {
			return fmt.Errorf("create %s: %w", paths[0], err)
		}
	}
	return errors.Join(errs...)
}

func appendFile(path string, cur, bundle []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	var b []byte
	if len(cur) > 0 && cur[len(cur)-1] != '\n' {
		b = append(b, '\n')
	}
	b = append(append(b, bundle...), '\n')
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
