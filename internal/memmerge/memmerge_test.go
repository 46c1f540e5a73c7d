package memmerge

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestParseStat(t *testing.T) {
	got := parseStat([]byte("ksm_rmap_items 12\nksm_zero_pages 3\nksm_merge_any: yes\nksm_mergeable: no\n\n"))
	want := map[string]string{"ksm_rmap_items": "12", "ksm_zero_pages": "3", "ksm_merge_any": "yes", "ksm_mergeable": "no"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, v := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadHost(t *testing.T) {
	t.Run("no KSM", func(t *testing.T) {
		h, err := ReadHost(t.TempDir())
		if err != nil || h.Available {
			t.Fatalf("got %+v, %v; want not available, no error", h, err)
		}
	})
	t.Run("running", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"run": "1\n", "pages_to_scan": "100\n", "sleep_millisecs": "20\n"})
		h, err := ReadHost(dir)
		if err != nil {
			t.Fatal(err)
		}
		if want := (Host{Available: true, Run: 1, PagesToScan: 100, SleepMillis: 20}); h != want {
			t.Fatalf("got %+v, want %+v", h, want)
		}
	})
	t.Run("garbage", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"run": "on", "pages_to_scan": "100", "sleep_millisecs": "20"})
		if _, err := ReadHost(dir); err == nil || !strings.Contains(err.Error(), "run") {
			t.Fatalf("got %v, want an error naming the file", err)
		}
	})
}

func TestStartKsmd(t *testing.T) {
	for _, tc := range []struct {
		run     int
		started bool
	}{{0, true}, {2, true}, {1, false}} {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"run": strconv.Itoa(tc.run) + "\n"})
		started, err := startKsmd(dir, tc.run)
		if err != nil || started != tc.started {
			t.Fatalf("run %d: started %v, %v; want %v", tc.run, started, err, tc.started)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "run")); strings.TrimSpace(string(b)) != "1" {
			t.Fatalf("run %d: afterwards %q, want 1", tc.run, b)
		}
	}
	if _, err := startKsmd(filepath.Join(t.TempDir(), "missing"), 0); err == nil {
		t.Fatal("no KSM directory: want an error")
	}
}

// setKSM writes one of ksmd's switches on the real host and puts the old value back at the end.
func setKSM(t *testing.T, name, v string) {
	t.Helper()
	path := filepath.Join(SysDir, name)
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("this host must have KSM: %v", err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, bytes.TrimSpace(old), 0o644); err != nil {
			t.Errorf("restore %s: %v", path, err)
		}
	})
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

// TestEnableMerges runs on the real kernel: after Enable, this process and a child started
// through exec are marked, ksmd runs, and two identical pages this process holds get merged.
func TestEnableMerges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	setKSM(t, "run", "0")
	// A quick pace, so the merge shows within the test; restored afterwards.
	setKSM(t, "sleep_millisecs", "10")
	setKSM(t, "pages_to_scan", "5000")
	_, started, err := Enable(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !started {
		t.Fatal("ksmd was stopped: Enable should report that it started it")
	}
	if h, err := ReadHost(SysDir); err != nil || h.Run != 1 {
		t.Fatalf("ksmd after Enable: %+v, %v", h, err)
	}
	out, err := exec.CommandContext(ctx, "sh", "-c", "exec cat /proc/self/ksm_stat").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := parseStat(out)["ksm_merge_any"]; got != "yes" {
		t.Fatalf("a grandchild's ksm_merge_any = %q, want yes", got)
	}

	// 64 pages, all with the same non-zero contents, in fresh anonymous memory.
	const pages = 64
	mem, err := unix.Mmap(-1, 0, pages*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i := range mem {
		mem[i] = byte(i%4096) | 1
	}
	for {
		n, err := ksmPages(mem)
		if err != nil {
			t.Fatal(err)
		}
		if n == pages {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("ksmd merged %d of %d identical pages in time", n, pages)
		case <-time.After(200 * time.Millisecond):
		}
	}
	// The merged pages still read back as written.
	for i := range mem {
		if mem[i] != byte(i%4096)|1 {
			t.Fatalf("byte %d changed after the merge", i)
		}
	}
}

// ksmPages counts the pages of mem the kernel holds as KSM pages (KPF_KSM in /proc/kpageflags,
// by the frame numbers /proc/self/pagemap gives to root).
func ksmPages(mem []byte) (int, error) {
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return 0, err
	}
	defer pagemap.Close()
	flags, err := os.Open("/proc/kpageflags")
	if err != nil {
		return 0, err
	}
	defer flags.Close()
	const kpfKSM = 21
	base := uintptr(unsafe.Pointer(&mem[0]))
	n := 0
	buf := make([]byte, 8)
	for off := 0; off < len(mem); off += 4096 {
		if _, err := pagemap.ReadAt(buf, int64((base+uintptr(off))/4096*8)); err != nil {
			return 0, err
		}
		e := binary.LittleEndian.Uint64(buf)
		pfn := e & (1<<55 - 1)
		if e>>63 == 0 || pfn == 0 {
			continue // not present, or no frame numbers for us
		}
		if _, err := flags.ReadAt(buf, int64(pfn*8)); err != nil {
			return 0, err
		}
		if binary.LittleEndian.Uint64(buf)&(1<<kpfKSM) != 0 {
			n++
		}
	}
	return n, nil
}
