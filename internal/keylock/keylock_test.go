package keylock

import (
	"sync"
	"testing"
)

// One key is held by one caller at a time; the map forgets keys nobody holds.
func TestLock(t *testing.T) {
	var k Map
	var wg sync.WaitGroup
	held := map[string]int{}
	var mu sync.Mutex
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []string{"a", "b"}[i%2]
			unlock := k.Lock(key)
			mu.Lock()
			held[key]++
			if held[key] != 1 {
				t.Errorf("key %s held %d times", key, held[key])
			}
			mu.Unlock()
			mu.Lock()
			held[key]--
			mu.Unlock()
			unlock()
		}()
	}
	wg.Wait()
	if len(k.m) != 0 {
		t.Fatalf("%d keys left in the map", len(k.m))
	}
}
