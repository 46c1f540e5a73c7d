package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/vibemon/vmon/internal/envd/gen/filesystem"
)

func mkTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, p := range []string{"file1.txt", "subdir1/file.txt", "subdir1/subdir1_1/deep.txt", "subdir2/x.txt"} {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(root, "subdir2"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestListDir(t *testing.T) {
	e := startEnv(t)
	root := mkTree(t)
	ctx := context.Background()
	for _, tc := range []struct {
		depth uint32
		want  []string
	}{
		{0, []string{"file1.txt", "link", "subdir1", "subdir2"}},
		{1, []string{"file1.txt", "link", "subdir1", "subdir2"}},
		{2, []string{"file1.txt", "link", "subdir1", "subdir1/file.txt", "subdir1/subdir1_1", "subdir2", "subdir2/x.txt"}},
		{5, []string{"file1.txt", "link", "subdir1", "subdir1/file.txt", "subdir1/subdir1_1", "subdir1/subdir1_1/deep.txt", "subdir2", "subdir2/x.txt"}},
	} {
		resp, err := e.fsJSON.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: root, Depth: tc.depth}))
		if err != nil {
			t.Fatal(err)
		}
		if got := entryNames(resp.Msg.GetEntries(), root); !slices.Equal(got, tc.want) {
			t.Errorf("depth %d: %v, want %v", tc.depth, got, tc.want)
		}
	}
	resp, err := e.fsBin.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: root, Depth: 1}))
	if err != nil {
		t.Fatal(err)
	}
	link := resp.Msg.GetEntries()[1]
	if link.GetName() != "link" || link.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || link.GetSymlinkTarget() != filepath.Join(root, "subdir2") ||
		!strings.HasPrefix(link.GetPermissions(), "L") || link.GetMode() != 0o755 {
		t.Fatalf("symlink entry: %v", link)
	}
	if _, err := e.fsJSON.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: filepath.Join(root, "nope")})); connectCode(err) != connect.CodeNotFound {
		t.Fatalf("missing dir: %v", err)
	}
	if _, err := e.fsJSON.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: filepath.Join(root, "file1.txt")})); connectCode(err) != connect.CodeInvalidArgument {
		t.Fatalf("file: %v", err)
	}
}

// TestStatJSONWire checks the exact JSON the SDK parses: int64 as a string, enum names, mode bits.
func TestStatJSONWire(t *testing.T) {
	e := startEnv(t)
	root := mkTree(t)
	body, _ := json.Marshal(map[string]string{"path": filepath.Join(root, "file1.txt")})
	req, _ := http.NewRequest("POST", e.url+"/filesystem.Filesystem/Stat", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got struct {
		Entry map[string]any `json:"entry"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(raw, &got) != nil {
		t.Fatalf("stat: %d %s", resp.StatusCode, raw)
	}
	ent := got.Entry
	if ent["name"] != "file1.txt" || ent["type"] != "FILE_TYPE_FILE" || ent["size"] != "4" || ent["mode"] != float64(420) ||
		ent["permissions"] != "-rw-r--r--" || ent["path"] != filepath.Join(root, "file1.txt") || ent["modifiedTime"] == nil {
		t.Fatalf("entry %s", raw)
	}
	if _, err := time.Parse(time.RFC3339Nano, ent["modifiedTime"].(string)); err != nil {
		t.Fatalf("modifiedTime: %v", err)
	}
	// Unary errors are JSON with the Connect code string.
	body, _ = json.Marshal(map[string]string{"path": filepath.Join(root, "nope")})
	req, _ = http.NewRequest("POST", e.url+"/filesystem.Filesystem/Stat", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var cerr struct{ Code, Message string }
	if resp.StatusCode != 404 || json.Unmarshal(raw, &cerr) != nil || cerr.Code != "not_found" {
		t.Fatalf("stat missing: %d %s", resp.StatusCode, raw)
	}
}

func TestMakeDirMoveRemove(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	root := mkTree(t)
	dir := filepath.Join(root, "a", "b", "c")
	resp, err := e.fsJSON.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir}))
	if err != nil || resp.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || resp.Msg.GetEntry().GetPath() != dir {
		t.Fatalf("makedir: %v %v", resp, err)
	}
	if _, err := e.fsJSON.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir})); connectCode(err) != connect.CodeAlreadyExists {
		t.Fatalf("makedir again: %v", err)
	}
	if _, err := e.fsBin.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(root, "file1.txt")})); connectCode(err) != connect.CodeInvalidArgument {
		t.Fatalf("makedir on a file: %v", err)
	}
	if u := testUser; u != nil {
		udir := filepath.Join(root, "user-owned", "x")
		if _, err := e.fsJSON.MakeDir(ctx, asUser(connect.NewRequest(&fspb.MakeDirRequest{Path: udir}), u.Name)); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{udir, filepath.Dir(udir)} {
			if uid, gid, _ := statOwner(t, p); uid != u.UID || gid != u.GID {
				t.Fatalf("%s owned by %d:%d", p, uid, gid)
			}
		}
		// Relative paths resolve against the caller's home.
		t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(u.Home, "projects")) })
		st, err := e.fsJSON.MakeDir(ctx, asUser(connect.NewRequest(&fspb.MakeDirRequest{Path: "projects/p1"}), u.Name))
		if err != nil || st.Msg.GetEntry().GetPath() != filepath.Join(u.Home, "projects/p1") || st.Msg.GetEntry().GetOwner() != u.Name {
			t.Fatalf("relative makedir: %v %v", st, err)
		}
	}
	dst := filepath.Join(root, "moved", "deeper", "f.txt")
	mv, err := e.fsJSON.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: filepath.Join(root, "file1.txt"), Destination: dst}))
	if err != nil || mv.Msg.GetEntry().GetPath() != dst || mv.Msg.GetEntry().GetName() != "f.txt" {
		t.Fatalf("move: %v %v", mv, err)
	}
	if _, err := e.fsJSON.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: filepath.Join(root, "file1.txt"), Destination: dst})); connectCode(err) != connect.CodeNotFound {
		t.Fatalf("move missing: %v", err)
	}
	if _, err := e.fsBin.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: filepath.Join(root, "subdir1")})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "subdir1")); !os.IsNotExist(err) {
		t.Fatalf("remove: %v", err)
	}
	if _, err := e.fsJSON.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: filepath.Join(root, "never-existed")})); err != nil {
		t.Fatalf("remove missing: %v", err)
	}
	if _, err := e.fsJSON.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(root, "subdir1")})); connectCode(err) != connect.CodeNotFound {
		t.Fatalf("stat removed: %v", err)
	}
}

type fsEvent struct {
	name string
	typ  fspb.EventType
}

func TestWatchDir(t *testing.T) {
	e := startEnv(t)
	root := mkTree(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := e.fsJSON.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: root, Recursive: true, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first message is not start: %v %v", stream.Msg(), stream.Err())
	}
	events := make(chan *fspb.FilesystemEvent, 100)
	go func() {
		defer close(events)
		for stream.Receive() {
			if fe := stream.Msg().GetFilesystem(); fe != nil {
				events <- fe
			}
		}
	}()
	expect := func(want fsEvent) *fspb.FilesystemEvent {
		t.Helper()
		for {
			select {
			case fe, ok := <-events:
				if !ok {
					t.Fatalf("stream ended before %v: %v", want, stream.Err())
				}
				if fe.GetName() == want.name && fe.GetType() == want.typ {
					return fe
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no event %v", want)
			}
		}
	}
	// Overwriting an existing file is a WRITE named relative to the watched dir.
	if err := os.WriteFile(filepath.Join(root, "file1.txt"), []byte("overwritten"), 0o644); err != nil {
		t.Fatal(err)
	}
	fe := expect(fsEvent{"file1.txt", fspb.EventType_EVENT_TYPE_WRITE})
	if fe.GetEntry().GetPath() != filepath.Join(root, "file1.txt") {
		t.Fatalf("include_entry: %v", fe)
	}
	// Nested changes are reported by a recursive watch, including inside new directories.
	if err := os.WriteFile(filepath.Join(root, "subdir1", "subdir1_1", "new.txt"), []byte("n"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect(fsEvent{"subdir1/subdir1_1/new.txt", fspb.EventType_EVENT_TYPE_CREATE})
	if err := os.Mkdir(filepath.Join(root, "fresh"), 0o755); err != nil {
		t.Fatal(err)
	}
	expect(fsEvent{"fresh", fspb.EventType_EVENT_TYPE_CREATE})
	// No pause: content created before the new directory's watch exists is found by its scan.
	if err := os.WriteFile(filepath.Join(root, "fresh", "inner.txt"), []byte("i"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect(fsEvent{"fresh/inner.txt", fspb.EventType_EVENT_TYPE_CREATE})
	if err := os.Rename(filepath.Join(root, "subdir2", "x.txt"), filepath.Join(root, "y.txt")); err != nil {
		t.Fatal(err)
	}
	expect(fsEvent{"subdir2/x.txt", fspb.EventType_EVENT_TYPE_RENAME})
	expect(fsEvent{"y.txt", fspb.EventType_EVENT_TYPE_CREATE})
	if err := os.Chmod(filepath.Join(root, "y.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	expect(fsEvent{"y.txt", fspb.EventType_EVENT_TYPE_CHMOD})
	if err := os.Remove(filepath.Join(root, "y.txt")); err != nil {
		t.Fatal(err)
	}
	expect(fsEvent{"y.txt", fspb.EventType_EVENT_TYPE_REMOVE})
	cancel()

	// Errors: missing path, not a directory.
	bctx := context.Background()
	for path, code := range map[string]connect.Code{filepath.Join(root, "nope"): connect.CodeNotFound, filepath.Join(root, "file1.txt"): connect.CodeInvalidArgument} {
		s, err := e.fsBin.WatchDir(bctx, connect.NewRequest(&fspb.WatchDirRequest{Path: path}))
		if err == nil {
			for s.Receive() {
			}
			err = s.Err()
		}
		if connectCode(err) != code {
			t.Errorf("watch %s: %v, want %v", path, err, code)
		}
	}
}

func TestWatchDirNonRecursive(t *testing.T) {
	e := startEnv(t)
	root := mkTree(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := e.fsBin.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: root}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatal("no start")
	}
	_ = os.WriteFile(filepath.Join(root, "subdir1", "ignored.txt"), []byte("x"), 0o644)
	_ = os.WriteFile(filepath.Join(root, "top.txt"), []byte("x"), 0o644)
	for stream.Receive() {
		fe := stream.Msg().GetFilesystem()
		if fe == nil {
			continue
		}
		if strings.Contains(fe.GetName(), "/") {
			t.Fatalf("non-recursive watch reported %v", fe)
		}
		if fe.GetName() == "top.txt" {
			return
		}
	}
	t.Fatalf("no event for top.txt: %v", stream.Err())
}

func TestPollingWatcher(t *testing.T) {
	e := startEnv(t)
	root := mkTree(t)
	ctx := context.Background()
	cw, err := e.fsJSON.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: root, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	_ = os.WriteFile(filepath.Join(root, "subdir2", "polled.txt"), []byte("x"), 0o644)
	deadline := time.Now().Add(5 * time.Second)
	found := false
	for !found && time.Now().Before(deadline) {
		ev, err := e.fsJSON.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, fe := range ev.Msg.GetEvents() {
			found = found || (fe.GetName() == "subdir2/polled.txt" && fe.GetType() == fspb.EventType_EVENT_TYPE_CREATE)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !found {
		t.Fatal("polling watcher missed the create")
	}
	if _, err := e.fsJSON.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fsJSON.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id})); connectCode(err) != connect.CodeNotFound {
		t.Fatalf("removed watcher: %v", err)
	}
}

func TestAccessTokenOnRPC(t *testing.T) {
	e := startEnv(t)
	e.initEnvd(t, map[string]any{"accessToken": "rpc-token"})
	ctx := context.Background()
	if _, err := e.fsJSON.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/"})); connectCode(err) != connect.CodeUnauthenticated {
		t.Fatalf("without token: %v", err)
	}
	req := connect.NewRequest(&fspb.StatRequest{Path: "/"})
	req.Header().Set("X-Access-Token", "rpc-token")
	st, err := e.fsJSON.Stat(ctx, req)
	if err != nil || st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("with token: %v %v", st, err)
	}
}
