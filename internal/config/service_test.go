package config

import (
	"reflect"
	"syscall"
	"testing"
	"time"
)

func TestEqual(t *testing.T) {
	t.Parallel()
	base := func() Service {
		s := defaultService("web", "/srv")
		s.Command = []string{"serve", "-v"}
		s.Env = []string{"A=1"}
		s.DependsOn = []string{"db"}
		s.Ready = Readiness{Kind: ReadyExec, Command: []string{"ping", "-q"}, Period: time.Second, Timeout: time.Second}
		s.Liveness = &Probe{Kind: ReadyHTTP, URL: "http://a/", Period: time.Second, Timeout: time.Second, FailureThreshold: 3}
		return s
	}
	if !base().Equal(base()) {
		t.Fatal("a service is not Equal to an identical copy")
	}
	empty, nilled := base(), base()
	empty.Env, nilled.Env = []string{}, nil
	if !empty.Equal(nilled) {
		t.Error("nil and empty Env are not Equal")
	}
	changes := map[string]func(*Service){
		"Name":       func(s *Service) { s.Name = "api" },
		"Command":    func(s *Service) { s.Command = []string{"serve"} },
		"Shell":      func(s *Service) { s.Shell = true },
		"Dir":        func(s *Service) { s.Dir = "/tmp" },
		"Env":        func(s *Service) { s.Env = []string{"A=2"} },
		"Env order":  func(s *Service) { s.Env = []string{"B=2", "A=1"} },
		"User":       func(s *Service) { s.User = "nobody" },
		"Group":      func(s *Service) { s.Group = "nogroup" },
		"Restart":    func(s *Service) { s.Restart = RestartNever },
		"Success":    func(s *Service) { s.SuccessExit = []int{0, 1} },
		"StopSignal": func(s *Service) { s.StopSignal = syscall.SIGINT },
		"Timeout":    func(s *Service) { s.StopTimeout = time.Second },
		"DependsOn":  func(s *Service) { s.DependsOn = nil },
		"Essential":  func(s *Service) { s.Essential = true },
		"Autostart":  func(s *Service) { s.Autostart = false },
		"Backoff":    func(s *Service) { s.Backoff.Jitter = 0.5 },
		"CrashLoop":  func(s *Service) { s.CrashLoop.Cooldown = time.Minute },
		"Ready":      func(s *Service) { s.Ready.Kind = ReadyNotify },
		"ReadyCmd":   func(s *Service) { s.Ready.Command = []string{"ping"} },
		"ReadyURL":   func(s *Service) { s.Ready.URL = "http://b/" },
		"ReadyAddr":  func(s *Service) { s.Ready.Address = "b:1" },
		"ReadyEvery": func(s *Service) { s.Ready.Period = time.Minute },
		"ReadyTO":    func(s *Service) { s.Ready.Timeout = time.Minute },
		"StartTO":    func(s *Service) { s.StartTimeout = time.Second },
		"Watchdog":   func(s *Service) { s.Watchdog = time.Second },
		"Access":     func(s *Service) { s.NotifyAccess = NotifyMain },
		"Liveness":   func(s *Service) { s.Liveness = &Probe{Kind: ReadyTCP} },
		"No probe":   func(s *Service) { s.Liveness = nil },
		"ProbeURL":   func(s *Service) { s.Liveness.URL = "http://b/" },
		"Threshold":  func(s *Service) { s.Liveness.FailureThreshold = 1 },
		"Delay":      func(s *Service) { s.Liveness.InitialDelay = time.Second },
	}
	for field, change := range changes {
		s := base()
		change(&s)
		if s.Equal(base()) || base().Equal(s) {
			t.Errorf("a change to %s is not noticed by Equal", field)
		}
	}
	// Liveness is a pointer: two separately loaded probes that say the same
	// are Equal, or every reload would restart every probed service.
	if a, b := base(), base(); a.Liveness == b.Liveness || !a.Equal(b) {
		t.Error("equal liveness probes at different addresses are not Equal")
	}
	// Hooks are read when they run: changing one restarts nothing.
	for field, change := range map[string]func(*Service){
		"OnCrash":     func(s *Service) { s.OnCrash = []string{"release-tasks"} },
		"OnFailed":    func(s *Service) { s.OnFailed = []string{"page"} },
		"HookTimeout": func(s *Service) { s.HookTimeout = time.Minute },
	} {
		s := base()
		change(&s)
		if !s.Equal(base()) {
			t.Errorf("a change to %s makes the service differ, so a reload would restart it", field)
		}
	}
	// Every field of Service is covered above (Name..HookTimeout).
	if n := reflect.TypeFor[Service]().NumField(); n != 24 {
		t.Errorf("Service has %d fields; add the new ones to this test", n)
	}
}

func TestEqualAcrossLoads(t *testing.T) {
	t.Parallel()
	a, err := Load(write(t, "vigil.toml", web+"env = { A = \"1\" }\n"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load(write(t, "vigil.toml", "# reformatted\n[services.web]\nenv.A = \"1\"\ncommand = 'serve'\n"))
	if err != nil {
		t.Fatal(err)
	}
	// The two files live in different directories, which Dir reflects.
	a.Services[0].Dir = b.Services[0].Dir
	if !a.Services[0].Equal(b.Services[0]) {
		t.Errorf("the same service written differently is not Equal:\n%+v\n%+v", a.Services[0], b.Services[0])
	}
}

func TestDependencyOrder(t *testing.T) {
	t.Parallel()
	svc := func(name string, deps ...string) Service { return Service{Name: name, DependsOn: deps} }
	tests := []struct {
		name     string
		services []Service
		want     []string
	}{
		{"none", nil, []string{}},
		{"no dependencies keeps config order", []Service{svc("c"), svc("a"), svc("b")}, []string{"c", "a", "b"}},
		{"dependency moves ahead", []Service{svc("web", "db"), svc("db")}, []string{"db", "web"}},
		{"ties by config order", []Service{svc("a", "c"), svc("b"), svc("c")}, []string{"b", "c", "a"}},
		{"chain", []Service{svc("a", "b"), svc("b", "c"), svc("c")}, []string{"c", "b", "a"}},
		{"diamond", []Service{svc("app", "cache", "db"), svc("cache", "net"), svc("db", "net"), svc("net")},
			[]string{"net", "cache", "db", "app"}},
		{"unknown dependency ignored", []Service{svc("a", "ghost"), svc("b")}, []string{"a", "b"}},
		{"cycle still lists everyone", []Service{svc("x"), svc("a", "b"), svc("b", "a"), svc("c", "a")},
			[]string{"x", "a", "b", "c"}},
		{"self dependency ignored", []Service{svc("a", "a"), svc("b")}, []string{"a", "b"}},
	}
	for _, tt := range tests {
		if got := DependencyOrder(tt.services); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: DependencyOrder = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "abc", 3}, {"command", "command", 0}, {"comand", "command", 1},
		{"comamnd", "command", 1}, {"kitten", "sitting", 3}, {"on_failure", "on-failure", 1},
	} {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := editDistance(tt.b, tt.a); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.b, tt.a, got, tt.want)
		}
	}
}
