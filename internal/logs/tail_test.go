package logs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// tailReference is Tail done the obvious way, on the whole content at once.
func tailReference(content string, n, maxBytes int) []string {
	if content == "" || n <= 0 || maxBytes <= 0 {
		return nil
	}
	all := strings.Split(strings.TrimSuffix(content, "\n"), "\n")
	var out []string
	budget := maxBytes
	for i := len(all) - 1; i >= 0 && len(out) < n && len(all[i]) <= budget; i-- {
		budget -= len(all[i])
		out = append(out, all[i])
	}
	if len(out) == 0 {
		cut := all[len(all)-1]
		cut = cut[max(0, len(cut)-maxBytes):]
		for len(cut) > 0 && !utf8.RuneStart(cut[0]) {
			cut = cut[1:]
		}
		out = append(out, cut)
	}
	slices.Reverse(out)
	return out
}

func TestTailLinesMatchesReference(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		var b strings.Builder
		for range rng.IntN(30) {
			b.WriteString(strings.Repeat(string(rune('a'+rng.IntN(26))), rng.IntN([]int{3, 20, 200}[rng.IntN(3)])))
			if rng.IntN(10) == 0 {
				b.WriteString("é") // a rune a byte cut could split
			}
			b.WriteByte('\n')
		}
		content := b.String()
		if rng.IntN(2) == 0 { // no trailing newline
			content = strings.TrimSuffix(content, "\n")
		}
		n, maxBytes, block := rng.IntN(12), rng.IntN(400), 1+rng.IntN(64)
		got, err := tailLines(strings.NewReader(content), int64(len(content)), n, maxBytes, block)
		if err != nil {
			t.Fatal(err)
		}
		if want := tailReference(content, n, maxBytes); !slices.Equal(got, want) {
			t.Fatalf("case %d: tailLines(%q, n=%d, maxBytes=%d, block=%d) = %q, want %q", i, content, n, maxBytes, block, got, want)
		}
	}
}

func TestTailLines(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content string
		n, max  int
		want    []string
	}{
		{"empty", "", 5, 100, nil},
		{"one empty line", "\n", 5, 100, []string{""}},
		{"fewer lines than n", "a\nb\n", 5, 100, []string{"a", "b"}},
		{"n limit", "a\nb\nc\nd\n", 2, 100, []string{"c", "d"}},
		{"no trailing newline", "a\nb\nc", 2, 100, []string{"b", "c"}},
		{"blank lines count", "a\n\n\nb\n", 3, 100, []string{"", "", "b"}},
		{"byte limit drops older lines", "aaaa\nbbbb\ncccc\n", 5, 9, []string{"bbbb", "cccc"}},
		{"byte limit is inclusive", "aaaa\nbbbb\ncccc\n", 5, 8, []string{"bbbb", "cccc"}},
		{"newest line too long is cut to its end", "old\n0123456789\n", 5, 4, []string{"6789"}},
		{"cut does not split a rune", "xéé\n", 1, 3, []string{"é"}},
		{"n zero", "a\n", 0, 100, nil},
		{"maxBytes zero", "a\n", 1, 0, nil},
	}
	for _, tt := range tests {
		got, err := tailLines(strings.NewReader(tt.content), int64(len(tt.content)), tt.n, tt.max, 4)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

// writeLog writes the live file (and .1 when given) of service "web".
func writeLog(t *testing.T, state, live, rotated string) {
	t.Helper()
	f, err := OpenForChild(state, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(live); err != nil {
		t.Fatal(err)
	}
	if rotated != "" {
		if err := os.WriteFile(rotatedPath(Path(state, "web"), 1), []byte(rotated), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTailFiles(t *testing.T) {
	t.Parallel()
	big := numbered("big", 1, 200_000) // 2 MB: many blocks
	tests := []struct {
		name          string
		live, rotated string
		n, max        int
		want          []string
	}{
		{"small", "a\nb\n", "", 20, 8 << 10, []string{"a", "b"}},
		{"empty", "", "", 20, 8 << 10, nil},
		{"no trailing newline", "a\nb", "", 20, 8 << 10, []string{"a", "b"}},
		{"large", big, "", 3, 8 << 10, []string{"big-0199998", "big-0199999", "big-0200000"}},
		{"large, byte limit", big, "", 20, 25, []string{"big-0199999", "big-0200000"}},
		{"live enough, .1 untouched", "c\nd\n", "a\nb\n", 2, 100, []string{"c", "d"}},
		{"into .1", "c\nd\n", "a\nb\n", 3, 100, []string{"b", "c", "d"}},
		{"live empty after rotation", "", "a\nb\n", 5, 100, []string{"a", "b"}},
		{"line cut by rotation joins across", "tail\n", "a\nhead-", 5, 100, []string{"a", "head-tail"}},
		{"large across", numbered("new", 1, 5), big, 8, 8 << 10, []string{
			"big-0199998", "big-0199999", "big-0200000", "new-0000001", "new-0000002", "new-0000003", "new-0000004", "new-0000005"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			writeLog(t, state, tt.live, tt.rotated)
			got, err := Tail(state, "web", tt.n, tt.max)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Tail = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestTailMissing(t *testing.T) {
	t.Parallel()
	if _, err := Tail(t.TempDir(), "web", 20, 8<<10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("err = %v, want ErrNotExist", err)
	}
}

// TestTailReadsOnlyTheEnd checks that Tail reads backwards only as far as
// it needs: 1 MiB of one long line comes before the 20 lines it asks for.
func TestTailReadsOnlyTheEnd(t *testing.T) {
	t.Parallel()
	r := &countingReader{r: strings.NewReader(strings.Repeat("z", 1<<20) + numbered("l", 1, 30))}
	size := int64(1<<20 + 300)
	got, err := tailLines(r, size, 20, 8<<10, tailBlock)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 20 || got[19] != "l-0000030" {
		t.Fatalf("got %q", got)
	}
	if r.read > 2*tailBlock {
		t.Errorf("read %d bytes for 20 short lines", r.read)
	}
}

type countingReader struct {
	r    *strings.Reader
	read int
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.read += n
	return n, err
}

func BenchmarkTail100MiB(b *testing.B) {
	state := b.TempDir()
	f, err := OpenForChild(state, "web")
	if err != nil {
		b.Fatal(err)
	}
	var chunk bytes.Buffer
	for i := 0; chunk.Len() < 1<<20; i++ {
		fmt.Fprintf(&chunk, "%08d some ordinary log output of a service\n", i)
	}
	for written := 0; written < 100<<20; written += chunk.Len() {
		if _, err := f.Write(chunk.Bytes()); err != nil {
			b.Fatal(err)
		}
	}
	f.Close()
	b.ReportAllocs()
	for b.Loop() {
		lines, err := Tail(state, "web", 20, 8<<10)
		if err != nil || len(lines) != 20 {
			b.Fatalf("Tail = %d lines, %v", len(lines), err)
		}
	}
}
