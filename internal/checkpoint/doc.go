// Package checkpoint keeps vigil's atomic, checksummed snapshot of what
// recovery needs after the daemon's own death: desired services, live
// instances (pid, pgid, start time), breaker and backoff state, safe mode,
// leases and per-service state blobs (see State). Store writes and reads
// it; Scheduler decides when to write.
//
// Invariants: once a first checkpoint has been written there is no moment
// in which the directory holds no valid one, even across power loss; a
// reader never returns damaged data — a damaged file falls back to the
// backup, a damaged entry is skipped and reported; generations only grow.
// It does not decide what recovery does with a checkpoint, and it does not
// keep history beyond one previous generation (that is the journal's job).
//
// # Files
//
// Store.Dir holds two files, both in the format below:
//
//	checkpoint.json         the current generation
//	checkpoint.backup.json  the previous generation
//
// and, only while a write is in progress or after a writer died, temp
// files named "checkpoint.<12 hex>.tmp" and "checkpoint.backup.json.tmp";
// every Write removes those left behind first. Every file is created 0600
// with O_EXCL|O_NOFOLLOW, and no path is ever opened through a symlink.
//
// # Byte layout
//
// A checkpoint file is exactly two lines of UTF-8 text, each ending in a
// single "\n" (0x0a), and nothing else:
//
//	{"format":"vigil-checkpoint","version":1,"generation":7,"written_at":"2026-01-02T03:04:05.123456789Z","state":{...}}
//	crc32c=1a2b3c4d length=12345
//
// Line 1, the envelope, is one JSON object (RFC 8259) with these members,
// written in this order without insignificant white space; readers accept
// any order and ignore unknown members:
//
//	format      string, always "vigil-checkpoint"
//	version     integer, the schema version (Version); a reader rejects a
//	            newer version than its own with ErrFutureVersion
//	generation  integer > 0; each write uses one more than the last
//	written_at  string, RFC 3339 with fractional seconds, in UTC when written
//	state       object, State as encoding/json encodes it: "safe_mode"
//	            (bool) and "services" (array of Service objects, or null)
//
// Line 2, the trailer, is the ASCII text "crc32c=", then exactly 8
// lowercase hexadecimal digits, then " length=", then a decimal number
// without sign or leading zeros, then "\n". The number after length= is
// the byte count of line 1 including its "\n"; the hex digits are the
// CRC-32C (Castagnoli polynomial, as in iSCSI and ext4, hash/crc32's
// Castagnoli table) of exactly those bytes. The trailer is the file's last
// line: the file ends with its "\n", and line 1 is everything before the
// trailer.
//
// A reader checks, in this order, and rejects the whole file at the first
// failure: the trailer is present and well formed; the length matches;
// the CRC matches (ErrCorrupt for these three); the envelope decodes;
// format is "vigil-checkpoint"; 1 <= version <= Version; generation > 0;
// written_at is present, parses, is at most Store.MaxAge old (ErrTooOld)
// and at most Store.Skew in the future (ErrFromFuture). Files that pass
// are then checked entry by entry: each element of state.services that is
// not a valid Service — bad JSON, empty or duplicate name, desired not
// "running" or "stopped", negative restarts, a breaker state other than
// "", "closed", "open" or "half_open", a negative attempt, an instance with
// pid <= 0, pgid <= 0 or start_time 0, a blob that is not JSON — is
// skipped and reported as an EntryError; the others are kept.
//
// # Write protocol
//
// Write links, then renames; it never renames the current file away first:
//
//  1. remove temp files left by dead writers (fsutil.CleanTemp);
//  2. write the new checkpoint to checkpoint.<random>.tmp and fsync it; a
//     failed write or fsync discards that file — it is never renamed;
//  3. if checkpoint.json exists, hard-link it as checkpoint.backup.json.tmp
//     and rename that over checkpoint.backup.json (the previous generation
//     is now in both names);
//  4. rename the temp file over checkpoint.json;
//  5. fsync the directory, and only then report success.
//
// Each step is atomic and the directory's entries change in order, so a
// power loss at any point leaves checkpoint.json holding the generation
// before the write or the new one, and a successful Write survives.
//
// Read returns the valid file with the highest generation (the current
// one unless it is damaged) and reports why any other present file was
// rejected.
package checkpoint
