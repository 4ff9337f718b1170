package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsExamples keeps docs/config.md honest: every ```toml and
// ```procfile block must load, unless a ```text block starting with
// "$ vigil check" follows it, which must then be exactly its problems.
func TestDocsExamples(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```(\\w+)\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	checked := 0
	for i, b := range blocks {
		lang, body := b[1], b[2]
		name := map[string]string{"toml": "vigil.toml", "procfile": "Procfile"}[lang]
		if name == "" {
			continue
		}
		checked++
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		got := ""
		if err != nil { // as `vigil check` run in the file's directory shows it
			got = strings.ReplaceAll(err.Error(), filepath.Dir(path)+string(filepath.Separator), "")
		}
		want := ""
		if i+1 < len(blocks) && blocks[i+1][1] == "text" && strings.HasPrefix(blocks[i+1][2], "$ vigil check\n") {
			want = strings.TrimSuffix(strings.TrimPrefix(blocks[i+1][2], "$ vigil check\n"), "\n")
		}
		switch {
		case want == "" && err != nil:
			t.Errorf("example %d (%s) does not load:\n%s\n%s", checked, lang, got, body)
		case got != want:
			t.Errorf("example %d (%s) gives\n%s\nbut the docs say\n%s", checked, lang, got, want)
		}
	}
	if checked < 5 {
		t.Errorf("found only %d examples in docs/config.md", checked)
	}
}
