//go:build !linux

package mountns

// Enter does nothing where there are no mount namespaces (nothing vmon mounts works there).
func Enter(dataDir string) error { return nil }
