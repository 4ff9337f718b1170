package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"
)

// Type is a record's kind.
type Type uint8

const (
	// TypeEvent is an event.Event.
	TypeEvent Type = 1
	// TypeCrash is a crash.detected event.Event; its Crash field holds the
	// whole crash record. A type of its own, so crash queries skip the rest
	// without decoding it.
	TypeCrash Type = 2
	// TypeShutdown marks a clean stop of the daemon: the next start needs
	// no recovery.
	TypeShutdown Type = 3
	// TypeRecovery is a recovery stage change.
	TypeRecovery Type = 4
)

func (t Type) String() string {
	switch t {
	case TypeEvent:
		return "event"
	case TypeCrash:
		return "crash"
	case TypeShutdown:
		return "shutdown"
	case TypeRecovery:
		return "recovery"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Record is one journal entry.
type Record struct {
	Seq     uint64
	Type    Type
	Time    time.Time
	Payload []byte
}

const (
	headerSize = 32
	magic      = "VJR1"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors. Wrapped with the segment and offset where they were found.
var (
	ErrCorrupt  = errors.New("journal: corrupt record")
	ErrTooLarge = errors.New("journal: record too large")
	ErrClosed   = errors.New("journal: closed")
	ErrBehind   = errors.New("journal: too many records waiting to be written")
)

// appendFrame encodes r onto b.
func appendFrame(b []byte, r Record) []byte {
	start := len(b)
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Payload)))
	b = append(b, 0, 0, 0, 0) // CRC, filled in below
	b = append(b, byte(r.Type), 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, r.Seq)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Time.UnixNano()))
	b = append(b, r.Payload...)
	f := b[start:]
	binary.LittleEndian.PutUint32(f[8:12], frameCRC(f))
	return b
}

func frameCRC(f []byte) uint32 {
	c := crc32.Update(0, castagnoli, f[4:8])
	return crc32.Update(c, castagnoli, f[12:])
}

// header is a frame's fixed part, decoded but not yet verified.
type header struct {
	length uint32
	crc    uint32
	typ    Type
	seq    uint64
	nanos  int64
}

func parseHeader(h []byte) (header, bool) {
	if len(h) < headerSize || string(h[0:4]) != magic || h[13]|h[14]|h[15] != 0 {
		return header{}, false
	}
	return header{
		length: binary.LittleEndian.Uint32(h[4:8]),
		crc:    binary.LittleEndian.Uint32(h[8:12]),
		typ:    Type(h[12]),
		seq:    binary.LittleEndian.Uint64(h[16:24]),
		nanos:  int64(binary.LittleEndian.Uint64(h[24:32])),
	}, true
}

// frameAt verifies the frame at the start of b and returns its size; ok is
// false when b does not start with a complete, verifying frame. The
// payload of r aliases b.
func frameAt(b []byte, maxRecord int) (r Record, size int, ok bool) {
	h, ok := parseHeader(b)
	if !ok || int64(h.length) > int64(maxRecord) || len(b)-headerSize < int(h.length) {
		return Record{}, 0, false
	}
	size = headerSize + int(h.length)
	if frameCRC(b[:size]) != h.crc {
		return Record{}, 0, false
	}
	return Record{Seq: h.seq, Type: h.typ, Time: time.Unix(0, h.nanos), Payload: b[headerSize:size]}, size, true
}

// nextValid returns the offset of the first verifying frame in b after
// position 0, or -1.
func nextValid(b []byte, maxRecord int) int {
	for off := 1; off < len(b); {
		i := bytes.Index(b[off:], []byte(magic))
		if i < 0 {
			return -1
		}
		off += i
		if _, _, ok := frameAt(b[off:], maxRecord); ok {
			return off
		}
		off++
	}
	return -1
}
