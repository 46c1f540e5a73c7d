package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// apiClient talks to a running vmon serve's E2B API, as the SDK and the E2B CLI do.
type apiClient struct {
	base string
	key  string
	http *http.Client
}

type apiError struct {
	Status  int
	Message string
}

// newAPIClient talks to the running vmon serve at apiURL with key, or the data dir's own key.
// timeout 0 means none (streams).
func newAPIClient(dataDir, apiURL, key string, timeout time.Duration) (*apiClient, error) {
	if key == "" {
		b, err := os.ReadFile(filepath.Join(dataDir, "api-key"))
		if err != nil {
			return nil, fmt.Errorf("no --api-key and none in %s: %w", dataDir, err)
		}
		key = strings.TrimSpace(string(b))
	}
	return &apiClient{base: strings.TrimRight(apiURL, "/"), key: key, http: &http.Client{Timeout: timeout}}, nil
}

func (e *apiError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

// send runs req and turns an error status into an *apiError with E2B's message; a 2xx response
// is returned for the caller to read and close.
func (c *apiClient) send(req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reach vmon at %s (is `vmon serve` running? see --api-url): %w", c.base, err)
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(data, &e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(data))
	}
	return nil, &apiError{Status: resp.StatusCode, Message: e.Message}
}

func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", c.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if out != nil && len(bytes.TrimSpace(data)) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

// contextArchive is a COPY step's files: a gzipped tar of src (a path relative to the context
// directory) and a hash of what it holds, the upload's cache key.
type contextArchive struct {
	hash string
	data []byte
}

// archiveContext packs src below ctxDir with paths relative to ctxDir (symlinks kept), the way
// the SDK does. The hash covers the step and each entry's path, mode, size and content, not
// times, so an unchanged tree is not uploaded again.
func archiveContext(ctxDir, src, dest string) (contextArchive, error) {
	root := filepath.Join(ctxDir, filepath.FromSlash(src))
	rel, err := filepath.Rel(ctxDir, root)
	if err != nil || !filepath.IsLocal(rel) {
		return contextArchive{}, fmt.Errorf("COPY source %q is outside the context directory %s", src, ctxDir)
	}
	h := sha256.New()
	fmt.Fprintf(h, "COPY %s %s", src, dest)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		name, err := filepath.Rel(ctxDir, p)
		if err != nil {
			return err
		}
		name = filepath.ToSlash(name)
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = name, 0, 0, "", ""
		if d.IsDir() {
			hdr.Name += "/"
		}
		fmt.Fprintf(h, "%s%d%d%s", name, info.Mode(), info.Size(), link)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(io.MultiWriter(tw, h), f)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		return contextArchive{}, fmt.Errorf("pack COPY source %s: %w", src, err)
	}
	return contextArchive{hash: hex.EncodeToString(h.Sum(nil)), data: buf.Bytes()}, nil
}

// uploadFiles stores an archive for a template unless the server already has it.
func (c *apiClient) uploadFiles(ctx context.Context, templateID string, a contextArchive) (bool, error) {
	var st struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	if err := c.do(ctx, http.MethodGet, "/templates/"+templateID+"/files/"+a.hash, nil, &st); err != nil {
		return false, err
	}
	if st.Present {
		return false, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, st.URL, bytes.NewReader(a.data))
	if err != nil {
		return false, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return false, &apiError{Status: resp.StatusCode, Message: strings.TrimSpace(string(msg))}
	}
	return true, nil
}

type buildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step"`
}

type buildStatus struct {
	Status     string          `json:"status"`
	LogEntries []buildLogEntry `json:"logEntries"`
	Reason     *struct {
		Message string `json:"message"`
		Step    string `json:"step"`
	} `json:"reason"`
}

// followBuild polls a build's status, printing its log as it grows, until it ends.
func (c *apiClient) followBuild(ctx context.Context, templateID, buildID string, w io.Writer) (buildStatus, error) {
	offset := 0
	start := time.Now()
	for {
		var st buildStatus
		path := fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", templateID, buildID, offset)
		if err := c.do(ctx, http.MethodGet, path, nil, &st); err != nil {
			return st, err
		}
		for _, e := range st.LogEntries {
			step := e.Step
			if step == "" {
				step = "-"
			}
			fmt.Fprintf(w, "%6.1fs %-8s %s\n", time.Since(start).Seconds(), step, e.Message)
		}
		offset += len(st.LogEntries)
		if (st.Status == "ready" || st.Status == "error") && len(st.LogEntries) == 0 {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
