package checkpoint

import (
	"testing"
)

// The benchmarks write through the real file system with real fsyncs.
func BenchmarkWrite25(b *testing.B)   { benchWrite(b, 25) }
func BenchmarkWrite1000(b *testing.B) { benchWrite(b, 1000) }

func benchWrite(b *testing.B, services int) {
	s := &Store{Dir: b.TempDir()}
	st := testState(services, 7)
	info := mustWrite(b, s, st)
	b.SetBytes(info.Size)
	b.ReportAllocs()
	for b.Loop() {
		mustWrite(b, s, st)
	}
}
