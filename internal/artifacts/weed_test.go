package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A real S3-compatible server for the S3 half of the suite: SeaweedFS's weed, built once per
// machine by scripts/weed.sh, started on loopback ports with a signing identity, shared by the
// package's tests (one bucket, each test under its own prefix, as nodes share a bucket) and
// stopped by TestMain.

const (
	weedAccessKey = "vmontestaccess"
	weedSecretKey = "vmontestsecret0123456789"
)

type weedServer struct {
	cmd      *exec.Cmd
	dir      string
	endpoint string
	log      *lockedWriter
	done     chan error
}

var weed struct {
	once sync.Once
	srv  *weedServer
	err  error // why there is no server
	skip bool  // err means "not built here", not a failure
	n    int   // prefixes handed out
}

const weedBucket = "vmon-test"

func TestMain(m *testing.M) {
	code := m.Run()
	if weed.srv != nil {
		weed.srv.stop()
	}
	os.Exit(code)
}

// weedS3 returns the shared server's endpoint, starting it on first use. In CI a missing or
// broken weed fails the test; elsewhere a weed that was never built skips it.
func weedS3(t testing.TB) string {
	t.Helper()
	weed.once.Do(func() {
		bin, skip, err := findWeed()
		if err != nil {
			weed.err, weed.skip = err, skip
			return
		}
		weed.srv, weed.err = startWeed(bin)
	})
	if weed.err != nil {
		if weed.skip && os.Getenv("CI") != "true" {
			t.Skipf("no S3 server: %v (run scripts/weed.sh once to build it)", weed.err)
		}
		t.Fatalf("S3 server (SeaweedFS weed): %v", weed.err)
	}
	return weed.srv.endpoint
}

// findWeed locates the weed binary: $VMON_WEED, else scripts/weed.sh, which in CI builds it (or
// waits for the build CI started in the background) and elsewhere only reports a cached build.
func findWeed() (bin string, skip bool, err error) {
	if p := os.Getenv("VMON_WEED"); p != "" {
		return p, false, nil
	}
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "weed.sh"))
	if err != nil {
		return "", false, err
	}
	args := []string{script}
	if os.Getenv("CI") != "true" {
		args = append(args, "--cached")
	}
	var stderr bytes.Buffer
	cmd := exec.Command("sh", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", true, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(lastLines(stderr.String(), 20)))
	}
	return strings.TrimSpace(string(out)), false, nil
}

func startWeed(bin string) (*weedServer, error) {
	dir, err := os.MkdirTemp("", "vmon-weed-")
	if err != nil {
		return nil, err
	}
	s3cfg := fmt.Sprintf(`{"identities":[{"name":"vmon","credentials":[{"accessKey":%q,"secretKey":%q}],"actions":["Admin","Read","Write","List","Tagging"]}]}`,
		weedAccessKey, weedSecretKey)
	if err := os.WriteFile(filepath.Join(dir, "s3.json"), []byte(s3cfg), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// weed's gRPC ports default to each port + 10000; they are picked free here as well.
	ports, err := freePorts(8)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := func(i int) string { return strconv.Itoa(ports[i]) }
	log := &lockedWriter{w: &bytes.Buffer{}}
	cmd := exec.Command(bin, "server",
		"-dir="+filepath.Join(dir, "data"),
		"-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port="+p(0), "-master.port.grpc="+p(1),
		"-volume.port="+p(2), "-volume.port.grpc="+p(3),
		"-filer.port="+p(4), "-filer.port.grpc="+p(5),
		"-s3", "-s3.port="+p(6), "-s3.port.grpc="+p(7),
		"-s3.config="+filepath.Join(dir, "s3.json"),
		// Small volumes, a fixed number of them: weed's default (as many as free disk holds,
		// at 30 GiB each) runs out after a few buckets on a small disk and answers 500.
		"-master.volumeSizeLimitMB=256", "-volume.max=100",
	)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &weedServer{cmd: cmd, dir: dir, endpoint: "http://127.0.0.1:" + p(6), log: log, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()

	// Ready when a signed request goes through: a bucket is made and listed.
	deadline := time.Now().Add(90 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-s.done:
			s.done <- err
			s.stop()
			return nil, fmt.Errorf("weed exited while starting: %v\n%s", err, lastLines(s.logText(), 30))
		case <-time.After(500 * time.Millisecond):
		}
		if last = s.probe(); last == nil {
			return s, nil
		}
	}
	text := s.logText()
	s.stop()
	return nil, fmt.Errorf("weed S3 not ready after 90 s: %v\n%s", last, lastLines(text, 30))
}

func (s *weedServer) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := openWeedBucket(ctx, s.endpoint, weedBucket, "")
	if err != nil {
		return err
	}
	if err := b.createBucket(ctx); err != nil {
		return err
	}
	return b.List(ctx, "", func(ObjectInfo) error { return nil })
}

func (s *weedServer) logText() string {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	return s.log.w.String()
}

// stop ends weed and every process it started, and removes its directory.
func (s *weedServer) stop() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL) // anything left in its group
	os.RemoveAll(s.dir)
}

// openWeedBucket opens an S3 backend on the test server the way a node would: endpoint, region
// and keys from the environment.
func openWeedBucket(ctx context.Context, endpoint, bucket, prefix string) (*S3Backend, error) {
	return openWeedBucketAs(ctx, endpoint, bucket, prefix, weedAccessKey, weedSecretKey)
}

func openWeedBucketAs(ctx context.Context, endpoint, bucket, prefix, accessKey, secretKey string) (*S3Backend, error) {
	env := map[string]string{
		"AWS_ENDPOINT_URL_S3":         endpoint,
		"AWS_ACCESS_KEY_ID":           accessKey,
		"AWS_SECRET_ACCESS_KEY":       secretKey,
		"AWS_REGION":                  "us-east-1",
		"AWS_CONFIG_FILE":             "/nonexistent/vmon-test",
		"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/vmon-test",
		"AWS_EC2_METADATA_DISABLED":   "true",
	}
	for k, v := range env {
		os.Setenv(k, v)
	}
	u := "s3://" + bucket
	if prefix != "" {
		u += "/" + prefix
	}
	return OpenS3(ctx, u)
}

// newWeedBackend gives a test its own empty prefix in the shared server's bucket.
func newWeedBackend(t testing.TB) *S3Backend {
	t.Helper()
	endpoint := weedS3(t)
	weed.n++
	b, err := openWeedBucket(context.Background(), endpoint, weedBucket, fmt.Sprintf("t%d/store", weed.n))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The server checks signatures: the wrong secret key is refused, as by a real bucket.
func TestS3RefusesBadSignature(t *testing.T) {
	good := newWeedBackend(t)
	ctx := context.Background()
	must(t, good.Put(ctx, "x/y", []byte("z")))
	prefix := strings.TrimSuffix(strings.TrimPrefix(good.String(), "s3://"+good.bucket+"/"), "/")
	bad, err := openWeedBucketAs(ctx, weedS3(t), good.bucket, prefix, weedAccessKey, "not-the-secret")
	must(t, err)
	if err := bad.Put(ctx, "x/w", []byte("z")); err == nil {
		t.Fatal("a put signed with the wrong secret was accepted")
	} else {
		t.Logf("refused: %v", err)
	}
	if _, err := bad.Get(ctx, "x/y"); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("a get signed with the wrong secret: %v", err)
	}
	_, _ = openWeedBucket(ctx, weedS3(t), good.bucket, "") // the environment back to the good keys
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() > 4<<20 {
		return len(p), nil // enough to debug a failure
	}
	return l.w.Write(p)
}
