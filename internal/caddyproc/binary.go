package caddyproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// buildDirPrefix names the temporary directories built binaries live in;
// the process id follows it, so a later run can remove what an earlier
// one left behind.
const buildDirPrefix = "caddyproc-"

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// Binary returns the Caddy binary to run: FLOODGATE_CADDY_BIN if set,
// otherwise one built from ./cmd/caddy of this module, once per test
// process. A failed build fails every test that asks for it.
func Binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv(BinaryEnv); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("caddyproc: %s=%s: %v", BinaryEnv, bin, err)
		}
		return bin
	}
	buildOnce.Do(func() { builtBin, buildErr = build() })
	if buildErr != nil {
		t.Fatalf("caddyproc: building caddy: %v", buildErr)
	}
	return builtBin
}

// build compiles ./cmd/caddy into a fresh temporary directory. A test
// process has no hook that runs after its last test, so the directory
// outlives it; instead each build removes the directories of processes
// that no longer exist, and at most one stale binary is ever kept.
func build() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module")
	}
	root := filepath.Dir(gomod)
	removeStaleBuilds()
	dir, err := os.MkdirTemp("", buildDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "caddy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go build ./cmd/caddy in %s: %w\n%s", root, err, out)
	}
	return bin, nil
}

// removeStaleBuilds deletes build directories whose process has exited.
func removeStaleBuilds() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), buildDirPrefix+"*"))
	for _, dir := range dirs {
		rest := strings.TrimPrefix(filepath.Base(dir), buildDirPrefix)
		pidText, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(dir)
		}
	}
}
