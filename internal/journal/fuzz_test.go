package journal

import (
	"bytes"
	"testing"

	"github.com/vigil-dev/vigil/internal/fsutil"
	"github.com/vigil-dev/vigil/internal/fsutil/fstest"
)

// FuzzReplay opens a journal whose newest segment holds arbitrary bytes:
// Open must not fail or panic, must keep only verifying records, and must
// leave a journal that takes an append and then reopens without repairs.
func FuzzReplay(f *testing.F) {
	var seg []byte
	for i := 1; i <= 3; i++ {
		seg = appendFrame(seg, Record{Seq: uint64(i), Type: TypeEvent, Payload: payload(i)})
	}
	f.Add(seg)
	f.Add(seg[:len(seg)-3])
	f.Add(append(bytes.Clone(seg), 0, 0, 0, 0, 0))
	flipped := bytes.Clone(seg)
	flipped[40] ^= 0xff
	f.Add(flipped)
	f.Add([]byte(magic + "\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fsys := &fstest.Crash{}
		fsys.MkdirAll("/j")
		if err := fsutil.WriteFile(fsys, "/j/"+segName(1), b); err != nil {
			t.Fatal(err)
		}
		j, err := Open(Options{FS: fsys, Dir: "/j", MaxRecord: 4096})
		if err != nil {
			t.Fatal(err)
		}
		var before []Record
		(&Reader{FS: fsys, Dir: "/j", MaxRecord: 4096}).Scan(func(r Record) bool {
			r.Payload = bytes.Clone(r.Payload)
			before = append(before, r)
			return true
		})
		seq, err := j.Write(TypeCrash, []byte("after"))
		if err != nil {
			t.Fatal(err)
		}
		j.Close()
		j, err = Open(Options{FS: fsys, Dir: "/j", MaxRecord: 4096})
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		if len(j.Repairs()) != 0 {
			t.Fatalf("second open repaired: %v", j.Repairs())
		}
		var after []Record
		probs, _ := (&Reader{FS: fsys, Dir: "/j", MaxRecord: 4096}).Scan(func(r Record) bool {
			r.Payload = bytes.Clone(r.Payload)
			after = append(after, r)
			return true
		})
		if len(probs) != 0 || len(after) != len(before)+1 || after[len(after)-1].Seq != seq {
			t.Fatalf("before %d records, after %d, problems %v", len(before), len(after), probs)
		}
		for _, r := range before {
			if r.Seq >= seq {
				t.Fatalf("appended seq %d not after replayed %d", seq, r.Seq)
			}
		}
	})
}
