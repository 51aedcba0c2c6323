package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// Part is a run whose scenarios were merged into a report (-merge): the
// report's results of Scenarios come from it, not from the report's own
// run, which Started, WallSecs, Meta and Notes of the report describe.
type Part struct {
	Scenarios []string       `json:"scenarios"`
	Started   time.Time      `json:"started"`
	WallSecs  float64        `json:"wall_seconds"`
	Meta      map[string]any `json:"meta"`
	Notes     []string       `json:"notes,omitempty"`
}

// readReport reads a results.json.
func readReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// mergeInto reads the report at basePath and returns it with run's
// scenarios (its Meta "scenarios") taken from run: their results replace
// the base's results of those scenarios, and run becomes a Part; an
// earlier part keeps only the scenarios run does not replace. The
// dispatch scaling figures are computed again from the merged results.
func mergeInto(basePath string, run *Report) (*Report, error) {
	base, err := readReport(basePath)
	if err != nil {
		return nil, err
	}
	scens := inScenarioOrder(strList(run.Meta["scenarios"]))
	if len(scens) == 0 {
		return nil, fmt.Errorf("merge: the run names no scenario")
	}
	replaced := func(s string) bool { return slices.Contains(scens, s) }
	var results []*Result
	for _, res := range base.Results {
		if !replaced(res.Scenario) {
			results = append(results, res)
		}
	}
	results = append(results, run.Results...)
	sort.SliceStable(results, func(i, j int) bool { return scenarioRank(results[i].Scenario) < scenarioRank(results[j].Scenario) })
	base.Results = results
	var parts []Part
	for _, p := range base.Parts {
		p.Scenarios = slices.DeleteFunc(p.Scenarios, replaced)
		if len(p.Scenarios) > 0 {
			parts = append(parts, p)
		}
	}
	base.Parts = append(parts, Part{Scenarios: scens, Started: run.Started, WallSecs: run.WallSecs, Meta: run.Meta, Notes: run.Notes})
	base.Derived = dispatchScaling(base.Results, reportImpls(base))
	return base, nil
}

// ownScenarios are the scenarios whose results come from the report's
// own run: those it measured that no part replaced.
func (r *Report) ownScenarios() []string {
	var own []string
	for _, s := range inScenarioOrder(strList(r.Meta["scenarios"])) {
		if !slices.ContainsFunc(r.Parts, func(p Part) bool { return slices.Contains(p.Scenarios, s) }) {
			own = append(own, s)
		}
	}
	return own
}

// runOf is the run whose results of scenario the report holds: -1 for
// the report's own, else the index of the part that replaced them.
func (r *Report) runOf(scenario string) int {
	return slices.IndexFunc(r.Parts, func(p Part) bool { return slices.Contains(p.Scenarios, scenario) })
}

// runMeta is the Meta of the run whose results of scenario the report
// holds.
func (r *Report) runMeta(scenario string) map[string]any {
	if i := r.runOf(scenario); i >= 0 {
		return r.Parts[i].Meta
	}
	return r.Meta
}

// reportImpls are the implementations of the report's run, then those
// only its parts measured: the columns of its tables.
func reportImpls(r *Report) []string {
	names := strList(r.Meta["impls"])
	for _, p := range r.Parts {
		for _, n := range strList(p.Meta["impls"]) {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	return names
}

// inScenarioOrder sorts scenario names as they run (allScenarios), the
// unknown ones last.
func inScenarioOrder(ss []string) []string {
	out := slices.Clone(ss)
	sort.SliceStable(out, func(i, j int) bool { return scenarioRank(out[i]) < scenarioRank(out[j]) })
	return out
}

// scenarioRank is where s runs among allScenarios; unknown names last.
func scenarioRank(s string) int {
	if i := slices.Index(allScenarios, s); i >= 0 {
		return i
	}
	return len(allScenarios)
}

// strList is a list of strings in a report's Meta: a []string in a fresh
// report, a []any in one read from a file.
func strList(v any) []string {
	switch l := v.(type) {
	case []string:
		return l
	case []any:
		out := make([]string, len(l))
		for i, x := range l {
			out[i] = fmt.Sprint(x)
		}
		return out
	}
	return nil
}

// scenarioList names scenarios for a page: "e2e, e2e-limit".
func scenarioList(ss []string) string { return strings.Join(ss, ", ") }
