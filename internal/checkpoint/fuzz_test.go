package checkpoint

import (
	"bytes"
	"testing"
)

// FuzzDecode feeds decode arbitrary files, and (since random bytes never
// carry a matching CRC) the same bytes framed as a valid envelope line:
// decode must not panic, and whatever it accepts must encode and decode
// again to the same checkpoint.
func FuzzDecode(f *testing.F) {
	data, err := encode(3, t0, testState(2, 1))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add(envelopeWith(2, 1, t0))
	f.Fuzz(func(t *testing.T, data []byte) {
		roundTrip(t, data)
		if line, _, _ := bytes.Cut(data, []byte("\n")); len(line) > 0 {
			roundTrip(t, frame(string(line)))
		}
	})
}

func roundTrip(t *testing.T, data []byte) {
	d, err := decode(data)
	if err != nil {
		return
	}
	again, err := encode(d.Generation, d.WrittenAt, &d.State)
	if err != nil {
		t.Fatalf("decoded state does not encode: %v\n%q", err, data)
	}
	d2, err := decode(again)
	if err != nil {
		t.Fatalf("re-encoded checkpoint does not decode: %v\n%s", err, again)
	}
	if d2.Generation != d.Generation || !d2.WrittenAt.Equal(d.WrittenAt) || len(d2.Skipped) != 0 ||
		stateJSON(t, &d2.State) != stateJSON(t, &d.State) {
		t.Fatalf("round trip changed the checkpoint:\n%q\n%s", data, again)
	}
}
