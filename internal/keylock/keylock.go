// Package keylock holds one mutex per key (a sandbox id), made on demand and dropped when no one
// holds or waits for it, so that a map of them does not grow with every key ever seen.
package keylock

import "sync"

// Map is a set of mutexes, one per key. The zero Map is ready to use.
type Map struct {
	mu sync.Mutex
	m  map[string]*entry // +checklocks:mu
}

type entry struct {
	mu   sync.Mutex
	refs int
}

// Lock locks key and returns its unlock function.
func (k *Map) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*entry{}
	}
	e := k.m[key]
	if e == nil {
		e = &entry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
