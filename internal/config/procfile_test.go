package config

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestProcfile(t *testing.T) {
	t.Parallel()
	path := write(t, "Procfile", "# the app\n\nweb: bundle exec puma -p $PORT\n  worker:python worker.py --queue=a:b\r\nrelease.v2: ./migrate   \n")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(path)
	if cfg.Path != path || cfg.Dir != dir || cfg.StateDir != filepath.Join(dir, ".vigil") || cfg.Logs != (LogLimits{MaxSize: 10 << 20, MaxFiles: 3}) {
		t.Errorf("config = %+v, want defaults beside %s", cfg, path)
	}
	want := map[string]string{"web": "bundle exec puma -p $PORT", "worker": "python worker.py --queue=a:b", "release.v2": "./migrate"}
	var names []string
	for _, s := range cfg.Services {
		names = append(names, s.Name)
		expected := defaultService(s.Name, dir)
		expected.Command, expected.Shell = []string{"/bin/sh", "-c", want[s.Name]}, true
		if !reflect.DeepEqual(s, expected) {
			t.Errorf("service %s =\n%+v\nwant\n%+v", s.Name, s, expected)
		}
	}
	if !reflect.DeepEqual(names, []string{"web", "worker", "release.v2"}) {
		t.Errorf("services %q, want file order", names)
	}
}

func TestProcfileErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, procfile string
		want           []string
	}{
		{"no colon", "web: serve\n  just a command\n", []string{`2:3: expected "name: command"`}},
		{"bad name", "web: serve\nmy app: run\n", []string{`2:1: invalid service name "my app": ` + nameRule}},
		{"space before colon", "web : serve\n", []string{`1:1: invalid service name "web ": ` + nameRule}},
		{"duplicate", "web: a\n\nweb: b\n", []string{`3:1: duplicate service "web" (first defined on line 1)`}},
		{"empty command", "web:   \n", []string{`1:8: service "web" has an empty command`}},
		{"empty command after indent", "\tworker:\n", []string{`1:9: service "worker" has an empty command`}},
		{"NUL in command", "web: a\x00b\n", []string{`1:6: service "web": the command must not contain a NUL byte`}},
		{"nothing but comments", "# nothing\n\n", []string{`1:1: no services defined; add a line "name: command"`}},
		{"several", "a: x\nb\na: y\n-c: z\n", []string{
			`2:1: expected "name: command"`,
			`3:1: duplicate service "a" (first defined on line 1)`,
			`4:1: invalid service name "-c": ` + nameRule,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := write(t, "Procfile", tt.procfile)
			cfg, err := Load(path)
			if err == nil {
				t.Fatalf("Load succeeded (%+v), want %q", cfg, tt.want)
			}
			if got := problemsOf(t, err, path); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestFormatDetection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file, content string
		shell         bool // Procfile services are Shell; the TOML below uses an array
	}{
		{"Procfile", "web: serve\n", true},
		{"Procfile.dev", "# dev processes\n\nweb: serve\n", true},
		{"services.conf", "[services.web]\ncommand = [\"serve\"]\n", false},
		{"config", "# comment: with a colon\nservices.web.command = [\"serve\"]\n", false},
	}
	for _, tt := range tests {
		cfg, err := Load(write(t, tt.file, tt.content))
		if err != nil {
			t.Errorf("%s: %v", tt.file, err)
			continue
		}
		if cfg.Services[0].Shell != tt.shell {
			t.Errorf("%s was read as the wrong format: %+v", tt.file, cfg.Services[0])
		}
	}
	// A .toml file is TOML even if it looks like a Procfile.
	if _, err := Load(write(t, "vigil.toml", "web: serve\n")); err == nil {
		t.Errorf("vigil.toml holding a Procfile line loaded without error")
	}
}
