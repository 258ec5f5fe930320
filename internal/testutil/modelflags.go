package testutil

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// ModelConfig names the flags and defaults of one seeded model-based test
// (TestModel in limiter/nearcache, TestHandlerModel in the root package).
type ModelConfig struct {
	// Test is the test's name, for the flags' usage: "TestModel".
	Test string
	// Flag is the flags' prefix: "model" makes -model.seed.
	Flag string
	// Env is the environment variables' prefix: "FLOODGATE_MODEL" makes
	// FLOODGATE_MODEL_SEED.
	Env string
	// Log is what the base seed's log line calls the test: "model".
	Log string
	// Per is what each set of schedules runs for ("case": -model.schedules
	// counts per case), or "" for the whole test.
	Per string
	// Schedules is the number of schedules of a plain run, ShortSchedules
	// that of a -short one.
	Schedules, ShortSchedules int
	// Steps is the number of steps per schedule unless -FLAG.steps says.
	Steps int
	// Base is the base seed of a plain run, so that a plain run, as CI's,
	// tries the same schedules every time.
	Base uint64
	// Kinds are the kinds of step -FLAG.skip can leave out.
	Kinds []string
}

// ModelFlags are a model-based test's flags: -FLAG.seed (replay one
// schedule), -FLAG.base (the base seed schedule seeds derive from),
// -FLAG.schedules, -FLAG.steps and -FLAG.skip; the first three fall back
// on ENV_SEED, ENV_BASE and ENV_SCHEDULES when unset.
type ModelFlags struct {
	cfg              ModelConfig
	seed, base       *uint64
	schedules, steps *int
	skip             *string
}

// NewModelFlags registers c's flags on the command line. Call it from a
// test package's variable declarations, before the flags are parsed.
func NewModelFlags(c ModelConfig) *ModelFlags {
	per := ""
	if c.Per != "" {
		per = " per " + c.Per
	}
	return &ModelFlags{
		cfg:       c,
		seed:      flag.Uint64(c.Flag+".seed", 0, c.Test+": replay only this schedule seed"),
		base:      flag.Uint64(c.Flag+".base", 0, c.Test+": the base seed schedule seeds derive from (0: the fixed default; 1: a fresh random one)"),
		schedules: flag.Int(c.Flag+".schedules", 0, c.Test+": how many schedules"+per+" (0: the CI default)"),
		steps:     flag.Int(c.Flag+".steps", 0, c.Test+": steps per schedule (0: the default)"),
		skip:      flag.String(c.Flag+".skip", "", c.Test+": step kinds to leave out, comma-separated, to isolate a failure: "+strings.Join(c.Kinds, ",")),
	}
}

// Settings reads the flags and their environment variables: how many
// schedules to run and the seed they derive from, or, when replay, the
// one schedule seed to run.
func (f *ModelFlags) Settings(t testing.TB) (schedules int, seed uint64, replay bool) {
	t.Helper()
	// fromEnv is the flag's value, or when it is unset the variable's.
	fromEnv := func(v uint64, name string) uint64 {
		env := f.cfg.Env + "_" + name
		if s := os.Getenv(env); v == 0 && s != "" {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", env, err)
			}
			return n
		}
		return v
	}
	if seed = fromEnv(*f.seed, "SEED"); seed != 0 {
		return 1, seed, true
	}
	schedules = int(fromEnv(uint64(max(0, *f.schedules)), "SCHEDULES"))
	if schedules <= 0 {
		schedules = f.cfg.Schedules
		if testing.Short() {
			schedules = f.cfg.ShortSchedules
		}
	}
	switch seed = fromEnv(*f.base, "BASE"); seed {
	case 0:
		seed = f.cfg.Base
	case 1:
		seed = rand.Uint64()>>1 | 1
	}
	t.Logf("%s base seed %d (rerun every schedule with -%s.base=%d)", f.cfg.Log, seed, f.cfg.Flag, seed)
	return schedules, seed, false
}

// Steps is the number of steps per schedule: -FLAG.steps, or the default.
func (f *ModelFlags) Steps() int {
	if *f.steps > 0 {
		return *f.steps
	}
	return f.cfg.Steps
}

// Skips reports whether -FLAG.skip leaves out kind.
func (f *ModelFlags) Skips(kind string) bool {
	return slices.Contains(strings.Split(*f.skip, ","), kind)
}

// Skipping reports whether -FLAG.skip leaves out any kind of step.
func (f *ModelFlags) Skipping() bool { return *f.skip != "" }

// SkipArg repeats -FLAG.skip for a replay line: "" when it is unset.
func (f *ModelFlags) SkipArg() string {
	if *f.skip == "" {
		return ""
	}
	return fmt.Sprintf(" -%s.skip=%s", f.cfg.Flag, *f.skip)
}
