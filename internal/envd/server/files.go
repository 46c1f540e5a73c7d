package server

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vibemon/vmon/internal/envd/filesystem"
	"github.com/vibemon/vmon/internal/envd/users"
	"github.com/vibemon/vmon/internal/errdefs"
)

// fileEntry is one element of POST /files's response.
type fileEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// restUser returns the user of a REST request: the username query parameter, else the default.
func (s *Server) restUser(r *http.Request) (*users.User, string, error) {
	u, err := s.lookupUser(r.URL.Query().Get("username"))
	if err != nil {
		return nil, "", err
	}
	workdir, _ := s.Defaults()
	return u, workdir, nil
}

// download serves GET /files: the raw bytes of one file.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	if err := s.authorizeFile(r, "read", time.Now()); err != nil {
		s.writeError(w, r, err)
		return
	}
	u, workdir, err := s.restUser(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	path, err := u.Resolve(r.URL.Query().Get("path"), workdir)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// O_NONBLOCK: opening a FIFO must not wait for a writer (that would pin a thread for as long
	// as the guest likes); what was opened is checked on the descriptor, so a path swapped for a
	// FIFO or device after a stat cannot slip through.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		s.writeError(w, r, fileError(path, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		s.writeError(w, r, fileError(path, err))
		return
	}
	if err := regularFile(path, fi); err != nil {
		s.writeError(w, r, err)
		return
	}
	name := filepath.Base(path)
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": name}))
	if fi.Size() == 0 {
		// procfs and sysfs files report size 0 whatever they hold, and some cannot seek
		// (/proc/<pid>/mem), which ServeContent needs: stream what reading gives instead.
		streamPseudoFile(w, r, path, f, func(err error) { s.writeError(w, r, err) })
		return
	}
	http.ServeContent(w, r, name, fi.ModTime(), f)
}

// streamPseudoFile answers with whatever reading f gives, without a length. The first read
// happens before the status is sent, so a file that cannot be read at all gets an error answer:
// the reasons a guest can give (I/O, bad address or argument of a special file) are the client's
// 400, not a server fault.
func streamPseudoFile(w http.ResponseWriter, r *http.Request, path string, f *os.File, fail func(error)) {
	buf := make([]byte, 32<<10)
	n, err := f.Read(buf)
	if err != nil && !errors.Is(err, io.EOF) {
		if errors.Is(err, syscall.EIO) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EFAULT) ||
			errors.Is(err, syscall.ESPIPE) || errors.Is(err, syscall.EAGAIN) {
			fail(errdefs.InvalidArgument("path '%s' cannot be read: %v", path, errors.Unwrap(err)))
		} else {
			fail(fileError(path, err))
		}
		return
	}
	ctype := mime.TypeByExtension(filepath.Ext(path))
	if ctype == "" {
		ctype = http.DetectContentType(buf[:n])
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, werr := w.Write(buf[:n]); werr != nil || err != nil {
		return
	}
	// A later read error cuts the stream short: the client sees a truncated body, not a length
	// that lies.
	_, _ = io.Copy(w, f)
}

// upload serves POST /files: multipart/form-data (one "file" part per file, the filename carrying
// the target path) or application/octet-stream (one file at ?path=), optionally gzip-encoded.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	if err := s.authorizeFile(r, "write", time.Now()); err != nil {
		s.writeError(w, r, err)
		return
	}
	u, workdir, err := s.restUser(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	md, err := parseMetadata(r.Header)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := decodedBody(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer body.Close()

	queryPath := r.URL.Query().Get("path")
	ct, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		s.writeError(w, r, errdefs.InvalidArgument("invalid Content-Type: %v", err))
		return
	}
	var written []fileEntry
	switch ct {
	case "multipart/form-data":
		written, err = s.uploadMultipart(multipart.NewReader(body, params["boundary"]), u, workdir, queryPath, md)
	case "application/octet-stream":
		if queryPath == "" {
			err = errdefs.InvalidArgument("the path query parameter is required for application/octet-stream uploads")
			break
		}
		var path string
		if path, err = u.Resolve(queryPath, workdir); err == nil {
			var e fileEntry
			e, err = writeFile(path, body, u, md)
			written = append(written, e)
		}
	default:
		err = errdefs.InvalidArgument("unsupported Content-Type %q", ct)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, written)
}

func (s *Server) uploadMultipart(mr *multipart.Reader, u *users.User, workdir, queryPath string, md map[string]string) ([]fileEntry, error) {
	written := []fileEntry{}
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, errdefs.InvalidArgument("invalid multipart body: %v", err)
		}
		name, filename := formPart(part.Header)
		if name != "file" {
			_ = part.Close()
			continue
		}
		target := queryPath
		if target == "" {
			target = filename
		}
		if target == "" {
			return nil, errdefs.InvalidArgument("a file part has no filename and no path query parameter is set")
		}
		path, err := u.Resolve(target, workdir)
		if err != nil {
			return nil, err
		}
		if seen[path] {
			return nil, errdefs.InvalidArgument("path '%s' is given by more than one part", path)
		}
		seen[path] = true
		e, err := writeFile(path, part, u, md)
		_ = part.Close()
		if err != nil {
			return nil, err
		}
		written = append(written, e)
	}
	if len(written) == 0 {
		return nil, errdefs.InvalidArgument("no file part (form field \"file\") in the request")
	}
	return written, nil
}

// writeFile writes r to path as user u: missing parents are created 0755 and owned by u, an
// existing file is truncated, a new one is created 0666&~umask and owned by u. md replaces the
// file's metadata.
func writeFile(path string, r io.Reader, u *users.User, md map[string]string) (fileEntry, error) {
	if fi, err := os.Stat(path); err == nil {
		if err := regularFile(path, fi); err != nil {
			return fileEntry{}, err
		}
	}
	if err := filesystem.MkdirAllOwned(filepath.Dir(path), u.UID, u.GID); err != nil {
		return fileEntry{}, err
	}
	_, statErr := os.Lstat(path)
	created := errors.Is(statErr, fs.ErrNotExist)
	// O_NONBLOCK and the check on the descriptor: see download.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NONBLOCK, 0o666)
	if err != nil {
		return fileEntry{}, fileError(path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		err = fileError(path, err)
	} else {
		err = regularFile(path, fi)
	}
	if err != nil {
		f.Close()
		return fileEntry{}, err
	}
	_, err = io.Copy(f, bodyReader{r})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fileEntry{}, fileError(path, err)
	}
	if created {
		if err := os.Chown(path, int(u.UID), int(u.GID)); err != nil {
			return fileEntry{}, fmt.Errorf("chown %s: %w", path, err)
		}
	}
	if err := filesystem.ReplaceMetadata(path, md); err != nil {
		return fileEntry{}, err
	}
	return fileEntry{Path: path, Name: filepath.Base(path), Type: "file", Metadata: filesystem.ReadMetadata(path)}, nil
}

// regularFile refuses what /files must not read or write: directories, and FIFOs, sockets and
// devices, whose reads and writes can block forever or never end.
func regularFile(path string, fi fs.FileInfo) error {
	switch {
	case fi.IsDir():
		return errdefs.InvalidArgument("path '%s' is a directory", path)
	case !fi.Mode().IsRegular():
		return errdefs.InvalidArgument("path '%s' is not a regular file", path)
	}
	return nil
}

// fileError maps an OS error on path to the REST status the SDK expects.
func fileError(path string, err error) error {
	var readErr *bodyReadError
	switch {
	case errors.As(err, &readErr):
		return errdefs.InvalidArgument("invalid request body: %v", readErr.err)
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.NotFound("path '%s' does not exist", path)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &statusError{status: http.StatusInsufficientStorage, msg: fmt.Sprintf("not enough disk space to write '%s'", path)}
	case errors.Is(err, syscall.ENXIO), errors.Is(err, syscall.ENODEV):
		// open(2) of a socket, or of a FIFO with nobody at the other end (O_NONBLOCK).
		return errdefs.InvalidArgument("path '%s' is not a regular file", path)
	case errors.Is(err, syscall.EISDIR):
		return errdefs.InvalidArgument("path '%s' is a directory", path)
	case errors.Is(err, syscall.ENOTDIR):
		return errdefs.InvalidArgument("a parent of '%s' is not a directory", path)
	case errors.Is(err, fs.ErrPermission):
		return errdefs.Forbidden("permission denied for '%s'", path)
	}
	return fmt.Errorf("access '%s': %w", path, err)
}

// bodyReadError marks errors from reading the request body, as opposed to writing the file.
type bodyReadError struct{ err error }

func (e *bodyReadError) Error() string { return e.err.Error() }
func (e *bodyReadError) Unwrap() error { return e.err }

// bodyReader tags the read errors of a request body with bodyReadError.
type bodyReader struct{ r io.Reader }

func (b bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = &bodyReadError{err}
	}
	return n, err
}

// decodedBody undoes the request's Content-Encoding (gzip with the SDK's gzip option).
func decodedBody(r *http.Request) (io.ReadCloser, error) {
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return r.Body, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, errdefs.InvalidArgument("invalid gzip body: %v", err)
		}
		return zr, nil
	default:
		return nil, &statusError{status: http.StatusNotAcceptable, msg: fmt.Sprintf("unsupported Content-Encoding %q", enc)}
	}
}

// parseMetadata collects X-Metadata-<key>: <value> headers; keys are lower-cased, and keys and
// values must be printable ASCII (they become xattr names and values).
func parseMetadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	for k, vs := range h {
		key, ok := strings.CutPrefix(strings.ToLower(k), "x-metadata-")
		if !ok || len(vs) == 0 {
			continue
		}
		if key == "" || !printableASCII(key) || !printableASCII(vs[0]) {
			return nil, errdefs.InvalidArgument("metadata %q: keys and values must be printable ASCII", key)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = vs[0]
	}
	return md, nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
