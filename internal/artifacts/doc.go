// Package artifacts owns the artifact store the nodes of a cluster share: template builds and
// paused sandboxes' snapshots, pushed by the node that made them and pulled by any node that needs
// them.
//
// Layers, bottom up:
//
//   - A Backend holds immutable objects by key: a directory (the default, under the data dir; on a
//     shared filesystem such as NFS it is cluster-wide) or an S3-compatible bucket
//     (s3://bucket/prefix). Writes are all-or-nothing: a reader never sees half an object.
//   - Content-addressed objects on top: each regular file is cut into fixed-size chunks (8 MiB),
//     each chunk stored under the sha256 of its bytes and checked against it on every read; a
//     chunk of zeros (a hole) is not stored at all. Small files (up to 64 KiB) travel together
//     in packs of 2 to 8 MiB, stored and checked the same way, so a rootfs of 35,000 files is a
//     thousand objects rather than tens of thousands. A tree manifest records a directory: relative
//     paths, types, modes, owners, times, extended attributes, symlink targets, hard links, device
//     numbers and each file's chunk list. It is itself an object named by its digest.
//   - Named refs ("templates/base", "paused/<id>") point at a manifest digest. A push writes its
//     ref last, after every chunk and the manifest are stored, so a reader that sees a ref sees a
//     whole tree.
//
// Push and Pull move chunks in parallel with bounded concurrency. A push skips chunks the backend
// already holds, so an interrupted push resumes where it stopped; a pull takes chunks from the
// node's local cache first (a size-limited LRU that never evicts a chunk a running pull still has
// to write) and builds the tree in a temporary directory beside the target, renamed into place
// only when complete and synced.
//
// GC deletes chunks and manifests no ref reaches. It is safe against concurrent pushes: a push
// announces its commit (an intent object) and checks the GC state object before it writes its ref;
// a GC publishes that it is running before it waits for announced commits and marks what refs
// reach. A push that finds that a GC ran since it checked its chunks checks them again and uploads
// what went missing before committing. Chunks younger than the grace period are never deleted, so
// a GC does not throw away the work of a push in flight. Run GC from one process at a time.
//
// The package never touches sandboxes, runtimes, mounts or the node's data directory beyond the
// directories it is handed: what to push, where to pull to, its cache and (for the directory
// backend) the store's own root. It holds no global state; a Store is safe for concurrent use, and
// one cache directory belongs to one Store at a time.
package artifacts
