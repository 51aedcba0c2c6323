package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bucketq/bucketq/engine"
	"gopkg.in/yaml.v3"
)

// ConfigError is a configuration value that cannot be used. Origin says
// where it was written ("config.yaml:12", "env ENGINE_QUEUES", "flag
// --redis" or "default") and Key names the setting.
type ConfigError struct {
	Origin, Key, Msg string
}

func (e *ConfigError) Error() string {
	if e.Key == "" {
		return e.Origin + ": " + e.Msg
	}
	return e.Origin + ": " + e.Key + ": " + e.Msg
}

// override is one value given outside the file: a flag.
type override struct{ key, value, origin string }

// source says where loadSettings reads settings from, in increasing
// precedence: the file, the environment, flags.
type source struct {
	file      io.Reader // nil: no file
	fileName  string    // for messages
	environ   []string  // "NAME=value" entries, as os.Environ gives them
	overrides []override
}

// ParseConfig reads a config file from r (named name in messages),
// without environment or flags, and validates it.
func ParseConfig(r io.Reader, name string) (*Settings, error) {
	s, _, err := loadSettings(source{file: r, fileName: name})
	return s, err
}

// loadSettings applies the defaults, the file, the environment and the
// flags, in that order, then validates the result. Every problem is
// reported, in file order. It also returns warnings (unknown ENGINE_
// variables).
func loadSettings(src source) (*Settings, []string, error) {
	s := Defaults()
	var errs []error
	if src.file != nil {
		data, err := io.ReadAll(src.file)
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", src.fileName, err)
		}
		errs = append(errs, s.decodeFile(data, src.fileName))
	}
	for _, st := range settings {
		if v, ok := lookupEnv(src.environ, envName(st.key)); ok {
			errs = append(errs, s.setText(st.key, v, "env "+envName(st.key)))
		}
	}
	for _, o := range src.overrides {
		errs = append(errs, s.setText(o.key, o.value, o.origin))
	}
	errs = append(errs, s.validate())
	if err := errors.Join(flatten(errs)...); err != nil {
		return nil, nil, err
	}
	return s, unknownEnv(src.environ), nil
}

// flatten undoes errors.Join and orders the errors by file line; errors
// from the environment and flags come after those from the file.
func flatten(errs []error) []error {
	var out []error
	for _, err := range errs {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			out = append(out, flatten(j.Unwrap())...)
		} else if err != nil {
			out = append(out, err)
		}
	}
	line := func(err error) int {
		var ce *ConfigError
		if errors.As(err, &ce) {
			if i := strings.LastIndexByte(ce.Origin, ':'); i >= 0 {
				if n, err := strconv.Atoi(ce.Origin[i+1:]); err == nil {
					return n
				}
			}
		}
		return 1 << 30
	}
	slices.SortStableFunc(out, func(a, b error) int { return line(a) - line(b) })
	return out
}

func (s *Settings) decodeFile(data []byte, name string) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return syntaxError(data, name, err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return &ConfigError{Origin: fmt.Sprintf("%s:%d", name, more.Line), Msg: "only one YAML document is allowed"}
	}
	return s.setNode("", root(&doc), name)
}

// yamlLine is the "line N: " a YAML syntax error starts with.
var yamlLine = regexp.MustCompile(`^line [0-9]+: `)

// syntaxErrorLines bounds the file lines syntaxError looks through.
const syntaxErrorLines = 5000

// syntaxError reports err, the YAML parser's syntax error for data, at
// the bad line. The parser names the line of the block the error is in
// (the mapping or list it was reading), often lines before the bad one;
// the bad line is the first whose inclusion makes the file's opening
// lines fail the same way.
func syntaxError(data []byte, name string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	origin := name
	lines := bytes.SplitAfter(data, []byte("\n"))
	for n := 1; n <= min(len(lines), syntaxErrorLines); n++ {
		var doc yaml.Node
		perr := yaml.NewDecoder(bytes.NewReader(bytes.Join(lines[:n], nil))).Decode(&doc)
		if perr != nil && perr.Error() == err.Error() {
			origin = pos(name, n)
			msg = yamlLine.ReplaceAllString(msg, "")
			break
		}
	}
	return &ConfigError{Origin: origin, Msg: "YAML syntax: " + msg}
}

// root is a document's top node, aliases followed (a bounded number).
func root(n *yaml.Node) *yaml.Node {
	for i := 0; i < 16; i++ {
		switch {
		case n.Kind == yaml.AliasNode && n.Alias != nil:
			n = n.Alias
		case n.Kind == yaml.DocumentNode && len(n.Content) > 0:
			n = n.Content[0]
		default:
			return n
		}
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// pos is "file:line" for a file, and the variable or flag alone otherwise.
func pos(file string, line int) string {
	if strings.HasPrefix(file, "env ") || strings.HasPrefix(file, "flag ") || line == 0 {
		return file
	}
	return fmt.Sprintf("%s:%d", file, line)
}

// mapping calls f for each key of mapping node n, reporting keys given
// twice and going on past errors so that one run reports them all.
func mapping(n *yaml.Node, prefix, file string, f func(key string, v *yaml.Node, at string) error) error {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		what := "mapping of settings"
		if prefix == "handlers" {
			what = "mapping of task type to {command: [...]}"
		}
		return &ConfigError{Origin: pos(file, n.Line), Key: prefix, Msg: "want a " + what}
	}
	var errs []error
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := root(n.Content[i]), root(n.Content[i+1])
		at, key := pos(file, k.Line), k.Value
		if prefix != "" {
			key = prefix + "." + k.Value
		}
		switch {
		case k.Kind != yaml.ScalarNode:
			errs = append(errs, &ConfigError{Origin: at, Key: prefix, Msg: "want a plain key"})
		case seen[key]:
			errs = append(errs, &ConfigError{Origin: at, Key: key, Msg: "set twice"})
		default:
			errs = append(errs, f(key, v, at))
		}
		seen[key] = true
	}
	return errors.Join(errs...)
}

// setNode sets the settings under prefix from mapping node n.
func (s *Settings) setNode(prefix string, n *yaml.Node, file string) error {
	if prefix == "" && !isNull(n) && n.Kind != yaml.MappingNode {
		return &ConfigError{Origin: pos(file, n.Line), Msg: "want a mapping of settings at the top level"}
	}
	return mapping(n, prefix, file, func(key string, v *yaml.Node, at string) error {
		st, known := findSetting(key)
		switch {
		case known:
			return s.setValue(key, st.ptr(s), v, at, file)
		case slices.ContainsFunc(settings, func(st setting) bool { return strings.HasPrefix(st.key, key+".") }):
			return s.setNode(key, v, file)
		}
		return &ConfigError{Origin: at, Key: key, Msg: "unknown key" + suggest(key, func(k string) string { return k })}
	})
}

func findSetting(key string) (setting, bool) {
	i := slices.IndexFunc(settings, func(st setting) bool { return st.key == key })
	if i < 0 {
		return setting{}, false
	}
	return settings[i], true
}

// setText sets key from text, as the environment and flags give it:
// lists comma-separated, queues as name:weight, handlers as YAML.
func (s *Settings) setText(key, text, at string) error {
	st, _ := findSetting(key)
	n := &yaml.Node{Kind: yaml.ScalarNode, Value: text}
	switch st.ptr(s).(type) {
	case *map[string]HandlerSettings:
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
			return &ConfigError{Origin: at, Key: key, Msg: fmt.Sprintf("want YAML such as {resize: {command: [resize-image]}}: %v", err)}
		}
		n = root(&doc)
	case *[]string, *[]engine.QueueConfig:
		n = splitList(text)
	case *[]PeriodicSettings:
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
			return &ConfigError{Origin: at, Key: key, Msg: fmt.Sprintf("want YAML such as [{name: tick, every: 1m, type: t}]: %v", err)}
		}
		n = root(&doc)
	}
	return s.setValue(key, st.ptr(s), n, at, at)
}

// splitList is "a, b,c" as a YAML list.
func splitList(text string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.SequenceNode}
	for _, f := range strings.Split(text, ",") {
		if f = strings.TrimSpace(f); f != "" {
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: f})
		}
	}
	return n
}

// setValue sets *p, whose type says what v must be, and records where.
func (s *Settings) setValue(key string, p any, v *yaml.Node, at, file string) error {
	bad := func(format string, args ...any) error {
		return &ConfigError{Origin: at, Key: key, Msg: fmt.Sprintf(format, args...)}
	}
	s.origin[key] = at
	switch p := p.(type) {
	case *[]PeriodicSettings:
		return s.setPeriodic(key, p, v, at, file)
	case *map[string]HandlerSettings:
		hs := map[string]HandlerSettings{}
		err := mapping(v, key, file, func(hkey string, hv *yaml.Node, hat string) error {
			h := defaultHandler()
			s.origin[hkey] = hat
			hs[strings.TrimPrefix(hkey, key+".")] = h
			if hv.Kind != yaml.MappingNode {
				return &ConfigError{Origin: hat, Key: hkey, Msg: "want a mapping with command, env, dir, timeout, snooze, kill_grace, output_cap"}
			}
			err := mapping(hv, hkey, file, func(fkey string, fv *yaml.Node, fat string) error {
				f := handlerField(&h, strings.TrimPrefix(fkey, hkey+"."))
				if f == nil {
					return &ConfigError{Origin: fat, Key: fkey, Msg: "unknown key (want command, env, dir, timeout, snooze, kill_grace or output_cap)"}
				}
				return s.setValue(fkey, f, fv, fat, file)
			})
			hs[strings.TrimPrefix(hkey, key+".")] = h
			return err
		})
		*p = hs
		return err
	case *map[string]string:
		env := map[string]string{}
		err := mapping(v, key, file, func(ekey string, ev *yaml.Node, eat string) error {
			name := strings.TrimPrefix(ekey, key+".")
			if ev.Kind != yaml.ScalarNode || name == "" || strings.ContainsAny(name, "=\x00") {
				return &ConfigError{Origin: eat, Key: ekey, Msg: "want NAME: value"}
			}
			env[name] = ev.Value
			return nil
		})
		*p = env
		return err
	case *[]string, *[]engine.QueueConfig:
		if v.Kind == yaml.ScalarNode && !isNull(v) {
			if p, ok := p.(*[]string); ok && strings.HasPrefix(key, "handlers.") {
				if v.ShortTag() != "!!str" {
					// command: 5 or command: true is a slip, not a
					// shell command line (quote it if it is one).
					return bad("%s: want a list, e.g. [sh, -c, 'cat > /tmp/x'], or a shell command line as a string", v.Value)
				}
				*p = []string{"sh", "-c", v.Value}
				return nil
			}
			v = splitList(v.Value)
		}
		if v.Kind != yaml.SequenceNode {
			return bad("want a list")
		}
		var args []string
		var qs []engine.QueueConfig
		for i, it := range v.Content {
			it = root(it)
			if q, ok := p.(*[]engine.QueueConfig); ok {
				ikey, iat := fmt.Sprintf("queues[%d]", i), pos(file, it.Line)
				s.origin[ikey] = iat
				qc, err := queueNode(it, ikey, iat, file)
				if err != nil {
					return err
				}
				qs = append(qs, qc)
				*q = qs
			} else if it.Kind != yaml.ScalarNode {
				return bad("want a list of plain values")
			}
			args = append(args, it.Value)
		}
		if p, ok := p.(*[]string); ok {
			*p = append([]string{}, args...)
		} else if len(qs) == 0 {
			return bad("empty: want at least one queue")
		}
		return nil
	}
	if isNull(v) {
		if p, ok := p.(*string); ok {
			*p = ""
			return nil
		}
		return bad("no value given")
	}
	if v.Kind != yaml.ScalarNode {
		return bad("want a single value, not a %s", map[yaml.Kind]string{yaml.MappingNode: "mapping", yaml.SequenceNode: "list"}[v.Kind])
	}
	if d, ok := p.(*time.Duration); ok && strings.TrimSpace(v.Value) == "0" {
		*d = 0
		return nil
	}
	n := *v
	n.Tag, n.Style = "", 0 // resolved from the text, as the environment gives it
	if _, ok := p.(*string); ok {
		n.Tag = "!!str" // "123" and "true" are names too
	}
	if err := n.Decode(p); err != nil {
		return bad("%q: want %s", v.Value, map[string]string{"*int": "a whole number", "*bool": "true or false",
			"*time.Duration": "a duration such as 500ms, 30s or 1h30m"}[fmt.Sprintf("%T", p)])
	}
	return nil
}

// queueNode reads {name: N, weight: W, max_running: M, rate: R,
// key_max_running: K, key_rate: R} or, in text, "name:weight".
func queueNode(n *yaml.Node, key, at, file string) (engine.QueueConfig, error) {
	scalar := func(v string) *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Value: strings.TrimSpace(v), Line: n.Line}
	}
	if name, w, ok := strings.Cut(n.Value, ":"); n.Kind == yaml.ScalarNode && ok {
		n = &yaml.Node{Kind: yaml.MappingNode, Line: n.Line, Content: []*yaml.Node{scalar("name"), scalar(name), scalar("weight"), scalar(w)}}
	} else if n.Kind == yaml.ScalarNode {
		return engine.QueueConfig{Name: strings.TrimSpace(n.Value)}, nil
	}
	var q engine.QueueConfig
	if n.Kind != yaml.MappingNode {
		return q, &ConfigError{Origin: at, Key: key, Msg: "want {name: NAME, weight: N, max_running: M}"}
	}
	fields := map[string]any{"name": &q.Name, "weight": &q.Weight, "max_running": &q.MaxRunning,
		"rate": &q.Rate, "key_max_running": &q.KeyMaxRunning, "key_rate": &q.KeyRate}
	err := mapping(n, key, file, func(k string, v *yaml.Node, kat string) error {
		if p := fields[strings.TrimPrefix(k, key+".")]; p != nil {
			return (&Settings{origin: map[string]string{}}).setValue(k, p, v, kat, file)
		}
		if strings.TrimPrefix(k, key+".") == "fair" {
			return &ConfigError{Origin: kat, Key: k, Msg: "unknown key: a queue's keyed tasks are always taken round-robin by key, with no switch (docs/flow-control.md)"}
		}
		return &ConfigError{Origin: kat, Key: k, Msg: "unknown key (want name, weight, max_running, rate, key_max_running or key_rate)"}
	})
	return q, err
}

// handlerField is the field of h that key sets, nil for none.
func handlerField(h *HandlerSettings, key string) any {
	return map[string]any{"command": &h.Command, "env": &h.Env, "dir": &h.Dir, "timeout": &h.Timeout,
		"snooze": &h.Snooze, "kill_grace": &h.KillGrace, "output_cap": &h.OutputCap}[key]
}

// suggest names a known key close to key, for typos, both as spell
// writes a key.
func suggest(key string, spell func(string) string) string {
	best, bestD := "", 3
	for _, st := range settings {
		if d := editDistance(key, spell(st.key)); d < bestD {
			best, bestD = spell(st.key), d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+map[bool]int{true: 0, false: 1}[a[i-1] == b[j-1]])
		}
		prev = cur
	}
	return prev[len(b)]
}

// lookupEnv is the last value of name in environ, as os.Getenv gives it.
func lookupEnv(environ []string, name string) (string, bool) {
	v, found := "", false
	for _, kv := range environ {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v, found = val, true
		}
	}
	return v, found
}

// unknownEnv lists the ENGINE_ variables in environ that are not
// settings, with a suggestion each. ENGINE_CONFIG, ENGINE_TASK_* (set for
// handler commands), ENGINE_HTTP_TOKEN and ENGINE_TEST_* are known.
func unknownEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "ENGINE_") || name == envConfig || name == envHTTPToken ||
			strings.HasPrefix(name, "ENGINE_TASK_") || strings.HasPrefix(name, "ENGINE_TEST_") {
			continue
		}
		if !slices.ContainsFunc(settings, func(st setting) bool { return envName(st.key) == name }) {
			out = append(out, fmt.Sprintf("environment variable %s is not a setting%s", name, suggest(name, envName)))
		}
	}
	return out
}
