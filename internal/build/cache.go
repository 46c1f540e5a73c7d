package build

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"time"
)

// State is what a build has produced after a step: the layer stack and the image settings later
// steps and the template's sandboxes inherit. A cache entry stores the State after one step.
type State struct {
	// Layers are relative to the data dir, topmost first.
	Layers  []string          `json:"layers"`
	Env     map[string]string `json:"env,omitempty"`
	User    string            `json:"user"`
	Workdir string            `json:"workdir"`
	// StartSnapshot (relative to the data dir) is the started snapshot the finalize step made:
	// a sandbox of this state with the start command running and ready.
	StartSnapshot string `json:"startSnapshot,omitempty"`
}

func (s State) clone() State {
	c := s
	c.Layers = append([]string(nil), s.Layers...)
	c.Env = make(map[string]string, len(s.Env))
	for k, v := range s.Env {
		c.Env[k] = v
	}
	return c
}

// Directory names under the data dir. Layers are content-addressed by the key of the step that
// made them, so concurrent builds of the same step agree on the result's name.
const (
	LayersDir = "layers"
	cacheDir  = "build-cache"
)

var keyPattern = regexp.MustCompile(`^[a-f0-9]{64}$`)

type cacheEntry struct {
	Key     string    `json:"key"`
	State   State     `json:"state"`
	Created time.Time `json:"created"`
}

// cache maps step keys to States and owns the layer directories.
type cache struct{ dataDir string }

// layerPath is where the layer made by the step keyed key lives, relative to the data dir. Half
// the key keeps the overlay mount options short (they are limited to a page).
func layerPath(key string) string { return filepath.Join(LayersDir, key[:32]) }

func (c cache) abs(rel string) string { return filepath.Join(c.dataDir, rel) }

// get returns the State cached under key, if every layer it names still exists.
func (c cache) get(key string) (State, bool) {
	if !keyPattern.MatchString(key) {
		return State{}, false
	}
	b, err := os.ReadFile(filepath.Join(c.dataDir, cacheDir, key+".json"))
	if err != nil {
		return State{}, false
	}
	var e cacheEntry
	if json.Unmarshal(b, &e) != nil || e.Key != key || len(e.State.Layers) == 0 {
		return State{}, false
	}
	for _, l := range e.State.Layers {
		if !filepath.IsLocal(l) {
			return State{}, false
		}
		if fi, err := os.Stat(c.abs(l)); err != nil || !fi.IsDir() {
			return State{}, false
		}
	}
	if sn := e.State.StartSnapshot; sn != "" {
		if fi, err := os.Stat(c.abs(sn)); !filepath.IsLocal(sn) || err != nil || !fi.IsDir() {
			return State{}, false
		}
	}
	return e.State, true
}

// put records the State after the step keyed key.
func (c cache) put(key string, s State) error {
	dir := filepath.Join(c.dataDir, cacheDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create build cache: %w", err)
	}
	b, err := json.Marshal(cacheEntry{Key: key, State: s, Created: time.Now().UTC()})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".entry-*")
	if err != nil {
		return fmt.Errorf("write build cache: %w", err)
	}
	_, err = tmp.Write(b)
	err = errors.Join(err, tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, key+".json"))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write build cache: %w", err)
	}
	return nil
}

// staging returns a fresh directory name next to the layers for a layer under construction;
// publish moves it into place.
func (c cache) staging(key string) (string, error) {
	dir := filepath.Join(c.dataDir, LayersDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create layers dir: %w", err)
	}
	return filepath.Join(dir, fmt.Sprintf(".tmp-%s-%d", key[:12], time.Now().UnixNano())), nil
}

// publish moves a finished layer to its content-addressed place and returns its relative path.
// If another build published the same step first, that layer wins and tmp is removed.
func (c cache) publish(key, tmp string) (string, error) {
	rel := layerPath(key)
	err := os.Rename(tmp, c.abs(rel))
	if err != nil && (errors.Is(err, os.ErrExist) || errors.Is(err, syscall.ENOTEMPTY)) {
		_ = os.RemoveAll(tmp)
		return rel, nil
	}
	if err != nil {
		return "", fmt.Errorf("publish layer: %w", err)
	}
	return rel, nil
}

// sweep removes layers left under construction by a crash.
func (c cache) sweep() error {
	ents, err := os.ReadDir(filepath.Join(c.dataDir, LayersDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if len(e.Name()) > 5 && e.Name()[:5] == ".tmp-" {
			errs = append(errs, os.RemoveAll(filepath.Join(c.dataDir, LayersDir, e.Name())))
		}
	}
	return errors.Join(errs...)
}
