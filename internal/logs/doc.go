// Package logs keeps each service's output on disk: one file per service that
// the child writes to directly, bounded by size-based rotation, and read back
// by Tail (crash records, `vigil logs`), Follow (`vigil logs -f`) and the
// Prefixer (foreground `vigil up`).
//
// Layout: <state>/logs/ (mode 0700) holds <service>.log, the live file, and
// <service>.log.1 … <service>.log.N, older output, .1 being the newest.
//
// Invariants:
//   - The daemon never pipes output through itself. OpenForChild returns an
//     O_APPEND descriptor that the child inherits as stdout and stderr, so a
//     daemon crash neither loses output nor kills a child with SIGPIPE.
//   - Nothing here follows a symlink at a log path or writes to anything but
//     a regular file: every open uses O_NOFOLLOW and checks the file type.
//   - Rotation is copy-truncate, because children keep the descriptor: the
//     live file's content is copied into .1 (older files shift up, the oldest
//     is dropped) and the live file is truncated to 0; O_APPEND writers
//     continue at the new end. A rotated file holds at most MaxSize bytes,
//     plus at most MaxSize/MaxFiles when a rotation's small excess is kept
//     with it rather than costing a file of its own (and what the service
//     writes during the copy itself), so the rotated files of a service stay
//     within (MaxFiles+1) × MaxSize together. A larger burst is split into
//     MaxSize pieces cut at line starts, and the oldest pieces beyond
//     MaxFiles are dropped. Only the live file can run over MaxSize, by what
//     the service writes between two size checks (250ms apart while it
//     writes).
//   - Everything is event driven with inotify: no periodic timers, and no CPU
//     is spent while no service writes.
//
// What it deliberately does not do: it does not parse, timestamp or
// reformat output (the bytes are the child's), it does not fsync (output is
// not journal data), and it does not compress rotated files. Copy-truncate
// has one known cost that no reader of a shared descriptor can avoid: a write
// that lands between the last copy and the truncate is lost.
package logs
