// Package journal is vigil's append-only, CRC-framed record of what
// happened: crashes, state changes, operator actions, recovery stages.
// A record the daemon acts upon is made durable (fdatasync: the data and
// the size) before the action is acknowledged; concurrent appends share
// one sync (group commit).
//
// # Files
//
// The journal is a directory of segment files named by the sequence
// number of their first record, as 16 lowercase hex digits plus ".seg"
// ("000000000000002a.seg"). Only the newest segment is ever written;
// it is rotated once it reaches Options.SegmentSize, and the oldest
// segments are removed once the total size exceeds Options.MaxTotal or
// all their records are older than Options.MaxAge. Other files in the
// directory are repairs: "<segment>.<offset>.broken" is the whole
// segment as it was before a torn tail was cut off at offset, and
// "quarantine/<segment>.<offset>" the whole segment as it was when
// damage was found at offset with valid records after it.
//
// # Record frame
//
// A segment is a sequence of frames, each (all integers little-endian):
//
//	offset  size  field
//	0       4     magic "VJR1" (0x56 0x4a 0x52 0x31)
//	4       4     L: payload length in bytes, at most Options.MaxRecord
//	8       4     CRC-32C (Castagnoli) of bytes 4..8 followed by bytes 12..32+L
//	12      1     record type (see Type)
//	13      3     reserved, zero
//	16      8     sequence number, strictly increasing across the journal
//	24      8     time, Unix nanoseconds
//	32      L     payload (JSON for every type vigil writes)
//
// Sequence numbers increase by one per record except where a batch failed
// to be written (its records were never acknowledged), which leaves a gap.
//
// # Damage
//
// On Open, the newest segment is read to its end. A frame that does not
// verify, with no verifying frame after it, is a torn tail — the write
// was cut short by a crash: the segment is copied to a ".broken" file,
// cut back to the last good frame, and the repair is reported. Never
// fatal. A frame that does not verify followed by one that does is
// corruption, not a crash: the segment is copied whole into quarantine/,
// cut back to the last good frame before the damage so appends can go
// on, and the corruption is reported with its offset — nothing is dropped
// silently. A length field larger than Options.MaxRecord never makes a
// reader allocate it: the frame simply does not verify.
//
// Readers (Read, Follow) never modify anything and may run beside a live
// writer: in the newest segment an incomplete last frame is a write in
// progress, elsewhere damage is reported as a Problem and reading resumes
// at the next verifying frame.
package journal
