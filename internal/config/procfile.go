package config

import "strings"

// parseProcfile reads foreman's format: one "name: command" per line, blank
// lines and lines starting with '#' ignored. Each command runs through
// /bin/sh -c with every default, as foreman and overmind run them.
func parseProcfile(data []byte, path, dir string, pr *problems) *Config {
	cfg := defaultConfig(path, dir)
	definedOn := map[string]int{}
	lineNo := 0
	for line := range strings.Lines(string(data)) {
		lineNo++
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		skipped := 0 // bytes before the line's first column that carry no content
		if lineNo == 1 && strings.HasPrefix(line, "\uFEFF") {
			line, skipped = line[len("\uFEFF"):], len("\uFEFF")
		}
		text := strings.TrimLeft(line, " \t")
		if text == "" || text[0] == '#' {
			continue
		}
		at := position{lineNo, skipped + len(line) - len(text) + 1}
		name, command, ok := strings.Cut(text, ":")
		switch {
		case !ok:
			pr.add(at, `expected "name: command"`)
			continue
		case !serviceName.MatchString(name):
			pr.add(at, "invalid service name %q: %s", name, nameRule)
			continue
		case definedOn[name] != 0:
			pr.add(at, "duplicate service %q (first defined on line %d)", name, definedOn[name])
			continue
		}
		definedOn[name] = lineNo
		commandAt := position{lineNo, at.col + len(name) + 1 + len(command) - len(strings.TrimLeft(command, " \t"))}
		command = strings.TrimSpace(command)
		switch {
		case command == "":
			pr.add(commandAt, "service %q has an empty command", name)
			continue
		case strings.IndexByte(command, 0) >= 0:
			pr.add(commandAt, "service %q: the command must not contain a NUL byte", name)
			continue
		}
		s := defaultService(name, dir)
		s.Command, s.Shell = []string{"/bin/sh", "-c", command}, true
		cfg.Services = append(cfg.Services, s)
	}
	if len(cfg.Services) == 0 && len(pr.errs) == 0 {
		pr.add(position{1, 1}, `no services defined; add a line "name: command"`)
	}
	return cfg
}
