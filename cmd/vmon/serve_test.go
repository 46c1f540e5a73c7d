package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// One vmon serve per data dir: a second is refused, naming the holder, after waiting out a
// holder that goes away within the wait (a crash's forked child closing its copy at exec).
func TestLockDataDir(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	unlock, err := lockDataDir(ctx, dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockDataDir(ctx, dir, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "another vmon serve is running") ||
		!strings.Contains(err.Error(), "(pid "+strconv.Itoa(os.Getpid())+" ") {
		t.Fatalf("second lock: %v, want a refusal naming this process", err)
	}
	time.AfterFunc(100*time.Millisecond, unlock)
	unlock2, err := lockDataDir(ctx, dir, 5*time.Second)
	if err != nil {
		t.Fatalf("the lock was released within the wait: %v", err)
	}
	unlock2()
}
