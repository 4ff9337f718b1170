package journal

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkDurableAppend8 is 8 writers each waiting for its record to be
// durable (fsync on the real disk) before appending the next: group
// commit is what lets them share fsyncs.
func BenchmarkDurableAppend8(b *testing.B) {
	j, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	p := []byte(`{"topic":"service.state","service":"web","state":"running","from":"starting"}`)
	const writers = 8
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		n := b.N / writers
		if w < b.N%writers {
			n++
		}
		wg.Go(func() {
			for range n {
				if _, err := j.Write(TypeEvent, p); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "appends/s")
	st := j.Stats()
	b.ReportMetric(float64(st.Appended)/float64(st.Syncs), "records/fsync")
}

// BenchmarkNewestCrashes lists the newest 20 crash records of a journal of
// 1,000,000 records (default segments), as `vigil crashes` does. The
// journal is built once in a temp dir; VIGIL_BENCH_RECORDS changes its size.
func BenchmarkNewestCrashes(b *testing.B) {
	total := 1_000_000
	if s := os.Getenv("VIGIL_BENCH_RECORDS"); s != "" {
		fmt.Sscan(s, &total)
	}
	dir := b.TempDir()
	j, err := Open(Options{Dir: dir, MaxTotal: 1 << 40}) // keep every record
	if err != nil {
		b.Fatal(err)
	}
	crash := []byte(`{"service":"worker-17","pid":41234,"start_time":123456789,"class":"signal","signal":"SIGSEGV","core_dumped":true,"started_at":"2026-11-22T10:00:00Z","ended_at":"2026-11-22T10:05:00Z","uptime_ms":300000,"restarts":3,"output":["` +
		strings.Repeat("panic: runtime error: index out of range\", \"", 4) + `"],"leases":["task-7"],"action":"restart in 400ms"}`)
	event := []byte(`{"topic":"service.state","service":"worker-17","state":"running","from":"starting"}`)
	for i := range total {
		p, typ := event, TypeEvent
		if i%2 == 0 {
			p, typ = crash, TypeCrash
		}
		if _, err := j.Append(typ, p, nil); err != nil {
			if err := j.Sync(); err != nil {
				b.Fatal(err)
			}
			j.Append(typ, p, nil)
		}
	}
	if err := j.Close(); err != nil {
		b.Fatal(err)
	}
	rd := &Reader{Dir: dir}
	b.ResetTimer()
	for b.Loop() {
		recs, _, err := rd.Newest(Query{Types: []Type{TypeCrash}, Limit: 20,
			Match: func(r Record) bool { return bytes.Contains(r.Payload, []byte(`"service":"worker-17"`)) }})
		if err != nil || len(recs) != 20 {
			b.Fatalf("%d records, %v", len(recs), err)
		}
	}
}
