package netpool

import (
	"context"
	"testing"
)

// BenchmarkTake compares a create's network step with the ready pool (Take hands over a link
// that already has its namespace, peer, rules and closed chains) and without it (the same work
// on the request path).
//
//	go test ./internal/netpool -run '^$' -bench Take -benchtime 30x
func BenchmarkTake(b *testing.B) {
	ctx := context.Background()
	e := newEnv(b)
	cfg := e.config(MaxReady)
	p := e.pool(b, cfg)
	if _, err := p.Recover(ctx, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close(ctx) })
	b.Run("ready", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			waitReadyReal(b, p, 1)
			b.StartTimer()
			l, err := p.Take(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := p.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("on-demand", func(b *testing.B) {
		for b.Loop() {
			l, err := p.create(ctx, false)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := p.destroy(ctx, l.lease.Index); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
}
