package fsroot

// Exists reports whether p exists in the guest root at dir as the guest would resolve it:
// symlinks in an image are guest paths and never resolve against the host.
func Exists(dir, p string) bool {
	r, err := Open(dir)
	if err != nil {
		return false
	}
	defer r.Close()
	_, err = r.Stat(p)
	return err == nil
}
