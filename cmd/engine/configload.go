package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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
	Origin string
	Key    string
	Msg    string
}

func (e *ConfigError) Error() string {
	if e.Key == "" {
		return e.Origin + ": " + e.Msg
	}
	return e.Origin + ": " + e.Key + ": " + e.Msg
}

// override is one value given outside the file: a flag.
type override struct {
	key, value, origin string
}

// source says where LoadSettings reads settings from, in increasing
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
// flags, in that order, then validates the result. It also returns
// warnings (unknown ENGINE_ variables).
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
	errs = append(errs, s.applyEnv(src.environ))
	for _, o := range src.overrides {
		errs = append(errs, s.setString(o.key, o.value, o.origin))
	}
	// Values that could not be read keep their defaults; check the rest
	// too, so that one run reports every problem.
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

func findSetting(key string) (setting, bool) {
	for _, st := range settings {
		if st.key == key {
			return st, true
		}
	}
	return setting{}, false
}

// isSection reports whether key is a group of settings, such as "redis".
func isSection(key string) bool {
	for _, st := range settings {
		if strings.HasPrefix(st.key, key+".") {
			return true
		}
	}
	return false
}

func (s *Settings) decodeFile(data []byte, name string) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return &ConfigError{Origin: name, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return &ConfigError{Origin: fmt.Sprintf("%s:%d", name, more.Line), Msg: "only one YAML document is allowed"}
	}
	root := deref(&doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = deref(root.Content[0])
	}
	if isNull(root) {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		return &ConfigError{Origin: fmt.Sprintf("%s:%d", name, root.Line), Msg: "want a mapping of settings at the top level"}
	}
	return s.walk(root, "", name)
}

// deref follows aliases (a bounded number of them).
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; i < 16 && n.Kind == yaml.AliasNode && n.Alias != nil; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// walk sets the settings of mapping node n, whose keys are under prefix.
// It goes on past a bad key or value, so that one run reports them all.
func (s *Settings) walk(n *yaml.Node, prefix, file string) error {
	var errs []error
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		at := fmt.Sprintf("%s:%d", file, k.Line)
		if k.Kind != yaml.ScalarNode {
			errs = append(errs, &ConfigError{Origin: at, Key: prefix, Msg: "want a plain key"})
			continue
		}
		key := k.Value
		if prefix != "" {
			key = prefix + "." + k.Value
		}
		st, known := findSetting(key)
		switch {
		case seen[key]:
			errs = append(errs, &ConfigError{Origin: at, Key: key, Msg: "set twice"})
		case known:
			if err := s.setNode(st, v, at, file); err != nil {
				errs = append(errs, err)
			} else {
				s.origin[key] = at
			}
		case isSection(key) && v.Kind != yaml.MappingNode:
			errs = append(errs, &ConfigError{Origin: at, Key: key, Msg: "want a mapping of settings"})
		case isSection(key):
			if err := s.walk(v, key, file); err != nil {
				errs = append(errs, err)
			}
		default:
			errs = append(errs, &ConfigError{Origin: at, Key: key, Msg: "unknown key" + suggest(key)})
		}
		seen[key] = true
	}
	return errors.Join(errs...)
}

// suggest names a known key close to key, for typos.
func suggest(key string) string {
	best, bestD := "", 3
	for _, st := range settings {
		if d := editDistance(key, st.key); d < bestD {
			best, bestD = st.key, d
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
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// setNode sets one setting from a YAML value.
func (s *Settings) setNode(st setting, v *yaml.Node, at, file string) error {
	bad := func(format string, args ...any) error {
		return &ConfigError{Origin: at, Key: st.key, Msg: fmt.Sprintf(format, args...)}
	}
	switch p := st.ptr(s).(type) {
	case *[]string:
		if v.Kind == yaml.SequenceNode {
			out := []string{}
			for _, it := range v.Content {
				if it = deref(it); it.Kind != yaml.ScalarNode {
					return bad("want a list of names")
				}
				out = append(out, it.Value)
			}
			*p = out
			return nil
		}
	case *[]engine.QueueConfig:
		if v.Kind == yaml.SequenceNode {
			return s.queuesNode(v, file)
		}
	case *map[string]HandlerSettings:
		return s.handlersNode(v, file)
	}
	if isNull(v) {
		if p, ok := st.ptr(s).(*string); ok {
			*p = ""
			return nil
		}
		return bad("no value given")
	}
	if v.Kind != yaml.ScalarNode {
		return bad("want a single value, not a %s", kindName(v.Kind))
	}
	return s.setString(st.key, v.Value, at)
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	}
	return "value"
}

// setString sets key from text, as the environment and flags give it.
func (s *Settings) setString(key, text, at string) error {
	st, ok := findSetting(key)
	if !ok {
		return &ConfigError{Origin: at, Key: key, Msg: "unknown key"}
	}
	bad := func(format string, args ...any) error {
		return &ConfigError{Origin: at, Key: key, Msg: fmt.Sprintf(format, args...)}
	}
	switch p := st.ptr(s).(type) {
	case *string:
		*p = text
	case *int:
		n, err := strconv.ParseInt(strings.TrimSpace(text), 0, 0)
		if err != nil {
			return bad("%q: want a whole number", text)
		}
		*p = int(n)
	case *bool:
		b, err := strconv.ParseBool(strings.TrimSpace(text))
		if err != nil {
			return bad("%q: want true or false", text)
		}
		*p = b
	case *time.Duration:
		d, err := parseDuration(text)
		if err != nil {
			return bad("%q: want a duration such as 500ms, 30s or 1h30m", text)
		}
		*p = d
	case *[]string:
		*p = splitList(text)
	case *[]engine.QueueConfig:
		return s.queuesText(text, at)
	case *map[string]HandlerSettings:
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(text), &n); err != nil {
			return bad("want YAML such as {resize: {command: [resize-image]}}: %v", err)
		}
		root := deref(&n)
		if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
			root = deref(root.Content[0])
		}
		return s.handlersNode(root, at)
	}
	s.origin[key] = at
	return nil
}

func parseDuration(text string) (time.Duration, error) {
	text = strings.TrimSpace(text)
	if text == "0" {
		return 0, nil
	}
	return time.ParseDuration(text)
}

func splitList(text string) []string {
	out := []string{}
	for _, f := range strings.Split(text, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// queuesNode reads a list of {name, weight} mappings.
func (s *Settings) queuesNode(v *yaml.Node, file string) error {
	qs := []engine.QueueConfig{}
	for i, it := range v.Content {
		it = deref(it)
		key := fmt.Sprintf("queues[%d]", i)
		at := fmt.Sprintf("%s:%d", file, it.Line)
		if it.Kind != yaml.MappingNode {
			return &ConfigError{Origin: at, Key: key, Msg: "want {name: NAME, weight: N}"}
		}
		q := engine.QueueConfig{Weight: 1}
		for j := 0; j+1 < len(it.Content); j += 2 {
			k, val := deref(it.Content[j]), deref(it.Content[j+1])
			kat := fmt.Sprintf("%s:%d", file, k.Line)
			if val.Kind != yaml.ScalarNode {
				return &ConfigError{Origin: kat, Key: key + "." + k.Value, Msg: "want a single value"}
			}
			switch k.Value {
			case "name":
				q.Name = val.Value
			case "weight":
				n, err := strconv.Atoi(val.Value)
				if err != nil {
					return &ConfigError{Origin: kat, Key: key + ".weight", Msg: fmt.Sprintf("%q: want a whole number", val.Value)}
				}
				q.Weight = n
			default:
				return &ConfigError{Origin: kat, Key: key + "." + k.Value, Msg: "unknown key (want name or weight)"}
			}
		}
		qs = append(qs, q)
		s.origin[key] = at
	}
	s.Queues = qs
	return nil
}

// queuesText reads "critical:6,default:3,low" (weight 1 when left out).
func (s *Settings) queuesText(text, at string) error {
	qs := []engine.QueueConfig{}
	for i, f := range splitList(text) {
		name, w, hasW := strings.Cut(f, ":")
		q := engine.QueueConfig{Name: strings.TrimSpace(name), Weight: 1}
		if hasW {
			n, err := strconv.Atoi(strings.TrimSpace(w))
			if err != nil {
				return &ConfigError{Origin: at, Key: fmt.Sprintf("queues[%d].weight", i), Msg: fmt.Sprintf("%q: want a whole number", w)}
			}
			q.Weight = n
		}
		qs = append(qs, q)
		s.origin[fmt.Sprintf("queues[%d]", i)] = at
	}
	s.Queues = qs
	s.origin["queues"] = at
	return nil
}

// applyEnv applies every ENGINE_ variable of environ that names a
// setting; the last of a name wins, as in os.Getenv.
func (s *Settings) applyEnv(environ []string) error {
	var errs []error
	vals := map[string]string{}
	for _, kv := range environ {
		if name, v, ok := strings.Cut(kv, "="); ok {
			vals[name] = v
		}
	}
	for _, st := range settings {
		name := envName(st.key)
		if v, ok := vals[name]; ok {
			errs = append(errs, s.setString(st.key, v, "env "+name))
		}
	}
	return errors.Join(errs...)
}

// unknownEnv lists the ENGINE_ variables in environ that are not
// settings, with a suggestion each. ENGINE_CONFIG, ENGINE_TASK_* (set for
// handler commands) and ENGINE_TEST_* are known.
func unknownEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "ENGINE_") || name == envConfig ||
			strings.HasPrefix(name, "ENGINE_TASK_") || strings.HasPrefix(name, "ENGINE_TEST_") {
			continue
		}
		known := slices.ContainsFunc(settings, func(st setting) bool { return envName(st.key) == name })
		if !known {
			key := strings.ToLower(strings.TrimPrefix(name, "ENGINE_"))
			out = append(out, fmt.Sprintf("environment variable %s is not a setting%s", name, suggestEnv(key)))
		}
	}
	return out
}

func suggestEnv(key string) string {
	for _, st := range settings {
		flat := strings.ReplaceAll(st.key, ".", "_")
		if editDistance(key, flat) < 3 {
			return fmt.Sprintf(" (did you mean %s?)", envName(st.key))
		}
	}
	return ""
}
