// Package fsroot does file operations inside a guest root filesystem from the host, as root,
// without ever leaving it: every path is resolved by the kernel inside the root (openat2 with
// RESOLVE_IN_ROOT), so an image's absolute or ".." symlinks resolve as the guest would see them
// and never reach host files. Entries are created, replaced and removed by name relative to a
// resolved parent directory, with *at calls that do not follow the final component.
//
// Two layers of API share that walk. Root's path methods (Stat, ReadFile, MkdirAll, WriteFile,
// Symlink, ...) serve template builds, which provision images and apply COPY steps. The
// descriptor-level primitives (OpenFD, OpenDirFD, MkdirAllFD, RemoveAllAt, ReadDirNames,
// ProcPath) serve image unpacking, which applies layer entries with its own *at calls.
//
// Only Linux is supported; elsewhere Open fails. A root must never be one a sandbox is running
// on: the runtime assumes it owns those files.
package fsroot
