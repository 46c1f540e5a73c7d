package artifacts

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkPushPull pushes a 1 GiB tree (six 160 MiB files in 8 MiB chunks and 4096 files of
// 16 KiB in packs, random, so nothing dedups or is a hole) to each backend, then pulls it with an
// empty cache (every object from the backend) and again with the cache full. The S3 figures are
// those of a weed server on the same machine. Run it alone, once per iteration:
//
//	go test -run '^$' -bench PushPull -benchtime 1x ./internal/artifacts/
func BenchmarkPushPull(b *testing.B) {
	src := filepath.Join(b.TempDir(), "src")
	makeBenchTree(b, src)
	kinds := []struct {
		name string
		open func(b *testing.B) Backend
	}{
		{"dir", func(b *testing.B) Backend {
			d, err := OpenDir(filepath.Join(b.TempDir(), "store"))
			if err != nil {
				b.Fatal(err)
			}
			return d
		}},
		{"s3", func(b *testing.B) Backend { return newWeedBackend(b) }},
	}
	quiet := slog.New(slog.DiscardHandler)
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			var push, cold, warm time.Duration
			var size int64
			for i := 0; i < b.N; i++ {
				be := k.open(b)
				ctx := context.Background()
				s, err := New(Options{Backend: be, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				ps, err := s.Push(ctx, "templates/bench", src)
				if err != nil {
					b.Fatal(err)
				}
				push += ps.Duration
				size = ps.Bytes

				tmp := b.TempDir()
				puller, err := New(Options{Backend: be, Logger: quiet, CacheDir: filepath.Join(tmp, "cache"), CacheLimit: 4 << 30})
				if err != nil {
					b.Fatal(err)
				}
				pl, err := puller.Pull(ctx, "templates/bench", filepath.Join(tmp, "cold"))
				if err != nil {
					b.Fatal(err)
				}
				cold += pl.Duration
				pl, err = puller.Pull(ctx, "templates/bench", filepath.Join(tmp, "warm"))
				if err != nil {
					b.Fatal(err)
				}
				if pl.Fetched != 0 {
					b.Fatalf("warm pull fetched %d chunks", pl.Fetched)
				}
				warm += pl.Duration
				os.RemoveAll(tmp)
			}
			mbps := func(d time.Duration) float64 { return float64(size) * float64(b.N) / (1 << 20) / d.Seconds() }
			b.ReportMetric(mbps(push), "push-MB/s")
			b.ReportMetric(mbps(cold), "pull-MB/s")
			b.ReportMetric(mbps(warm), "pull-cached-MB/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func makeBenchTree(b *testing.B, root string) {
	r := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, 160<<20)
	for i := range 6 {
		_, _ = r.Read(buf)
		p := filepath.Join(root, "layers", fmt.Sprintf("big%d.img", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 4096 {
		_, _ = r.Read(buf[:16<<10])
		p := filepath.Join(root, "files", fmt.Sprintf("d%02d", i%64), fmt.Sprintf("f%04d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, buf[:16<<10], 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
