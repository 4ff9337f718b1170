package event

import "testing"

func TestPublishFansOutAndDropsForSlowSubscribers(t *testing.T) {
	var b Bus
	fast := b.Subscribe(10)
	slow := b.Subscribe(1)
	defer fast.Close()
	for i := 0; i < 3; i++ {
		b.Publish(Event{Topic: ServiceState, Service: "web"})
	}
	for want := uint64(1); want <= 3; want++ {
		if e := <-fast.C; e.Seq != want {
			t.Fatalf("fast got seq %d, want %d", e.Seq, want)
		}
	}
	if e := <-slow.C; e.Seq != 1 {
		t.Fatalf("slow got seq %d, want 1", e.Seq)
	}
	if slow.Dropped() != 2 {
		t.Fatalf("slow dropped %d, want 2", slow.Dropped())
	}
	slow.Close()
	slow.Close() // idempotent
	if _, ok := <-slow.C; ok {
		t.Fatal("closed subscription still delivers")
	}
	b.Publish(Event{})
}
